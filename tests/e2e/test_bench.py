"""`kestrel bench` against a running server (and one it launches): the table, the JSON, the plots."""

import json
import os
import subprocess
import sys

import pytest

from kestrel.cli import main
from tests.e2e.conftest import ENV

pytestmark = pytest.mark.e2e


def test_bench_cli_against_a_server(server, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "kestrel.cli", "bench", "--base-url", server.url, "--num-prompts", "8",
           "--random-input-len", "24", "--random-output-len", "6", "--random-range-ratio", "0.5",
           "--max-concurrency", "1,4", "--output-file", str(out), "--disable-tqdm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("request throughput", "output throughput", "Mean TTFT", "P99 ITL", "P90 E2E latency"):
        assert row in proc.stdout
    report = json.loads(out.read_text())
    assert [r["max_concurrency"] for r in report["runs"]] == [1, 4]
    for r in report["runs"]:
        assert r["completed"] == 8 and r["failed"] == 0
        assert r["output_tokens"] == sum(r["samples"]["output_lens"]) and r["p50_ttft_ms"] > 0
    for name in ("bench_latency_cdf.png", "bench_throughput.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("workload", [["--dataset-name", "shared-prefix", "--shared-prefix-groups", "2",
                                       "--system-prompt-len", "80", "--backend", "openai"],
                                      ["--dataset-name", "random", "--prompt-format", "text", "--request-rate", "50"]])
def test_bench_workloads(server, tmp_path, workload, capsys, server_flags):
    out = tmp_path / "b.json"
    tokenizer = server_flags[server_flags.index("--tokenizer-path") + 1] if "--tokenizer-path" in server_flags else None
    argv = ["bench", "--base-url", server.url, "--num-prompts", "8", "--random-input-len", "16",
            "--random-output-len", "4", "--output-file", str(out), "--disable-tqdm", "--no-plot", *workload,
            *(["--tokenizer", tokenizer] if tokenizer else [])]
    assert main(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["completed"] == 8 and run["output_tokens"] == 32
    if "shared-prefix" in workload:
        assert min(run["samples"]["prompt_lens"]) == 96
    assert "Serving benchmark" in capsys.readouterr().out


def test_bench_multi_turn_with_a_launched_server(tmp_path, server_flags, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "mt.json"
    argv = ["bench", "--launch-server", *server_flags, "--dataset-name", "multi-turn", "--num-turns", "3",
            "--num-prompts", "6", "--random-input-len", "70", "--random-output-len", "3", "--output-file", str(out),
            "--disable-tqdm", "--no-plot"]
    assert main(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    lens = run["samples"]["prompt_lens"]
    assert run["completed"] == 6 and sorted(lens) == sorted([70, 70, 143, 143, 216, 216])
