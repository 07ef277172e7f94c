"""`kestrel bench` pieces without a server (workloads, statistics, table, plots) and the serve / bench command
lines (every ServerArgs field is a flag of `kestrel serve`)."""

import argparse
import dataclasses
import json

import pytest

from kestrel.cli import main
from kestrel.config import ServerArgs
from kestrel.server import bench
from kestrel.server.bench import Result
from kestrel.server.cli import usage_banner


def bench_args(*argv) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_args(p)
    return p.parse_args(list(argv))


def test_workloads_have_the_asked_shapes():
    vocab = list(range(8, 100))
    reqs = bench.make_workload(bench_args("--num-prompts", "50", "--random-input-len", "40", "--random-output-len",
                                          "10", "--random-range-ratio", "0.5"), vocab)
    assert len(reqs) == 50 and all(20 <= len(r.prompt) <= 40 and 5 <= r.output_len <= 10 for r in reqs)
    assert all(t in vocab for r in reqs for t in r.prompt)
    assert reqs == bench.make_workload(bench_args("--num-prompts", "50", "--random-input-len", "40",
                                                  "--random-output-len", "10", "--random-range-ratio", "0.5"), vocab)
    shared = bench.make_workload(bench_args("--dataset-name", "shared-prefix", "--num-prompts", "12",
                                            "--shared-prefix-groups", "3", "--system-prompt-len", "30",
                                            "--random-input-len", "5"), vocab)
    assert len({tuple(r.prompt[:30]) for r in shared}) == 3 and all(len(r.prompt) == 35 for r in shared)
    turns = bench.make_workload(bench_args("--dataset-name", "multi-turn", "--num-prompts", "10", "--num-turns", "3"),
                                vocab)
    assert [r.conversation for r in turns] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_summary_table_and_plots(tmp_path):
    results = [Result(ok=True, prompt_len=10, output_len=4, ttft=0.01 * i, latency=0.1 * i, itl=[0.02, 0.03, 0.04])
               for i in range(1, 11)] + [Result(error="HTTP 400: bad")]
    runs = [bench.summarize(results, 2.0, c, float("inf")) for c in (1, 8)]
    r = runs[0]
    assert r["completed"] == 10 and r["failed"] == 1 and r["errors"] == ["HTTP 400: bad"]
    assert r["output_throughput"] == 20.0 and r["request_throughput"] == 5.0
    assert r["p50_ttft_ms"] == pytest.approx(55.0) and r["p99_e2e_ms"] == pytest.approx(991.0)
    assert r["mean_itl_ms"] == pytest.approx(30.0)
    text = bench.table(runs)
    assert "concurrency 1" in text and "concurrency 8" in text and "P99 ITL (ms)" in text
    json.dumps(runs)
    paths = bench.plot(runs, tmp_path / "x.json")
    assert [p.name for p in paths] == ["x_latency_cdf.png", "x_throughput.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_launch_passes_only_the_model_flags_given():
    args = bench_args("--model", "k3-tiny", "--dtype", "float32", "--disable-radix-cache", "--port", "1")
    assert bench.server_flags(args) == ["--model-path", "k3-tiny", "--dtype", "float32", "--disable-radix-cache"]


def test_serve_has_every_server_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(ServerArgs):
        assert "--" + f.name.replace("_", "-") in text
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--max-concurrency" in capsys.readouterr().out


def test_usage_banner_is_ready_to_paste():
    text = usage_banner("0.0.0.0", 8123, "k3-tiny", has_key=True, has_tokenizer=True)
    assert "curl http://127.0.0.1:8123/v1/chat/completions" in text and '"model": "k3-tiny"' in text
    assert 'base_url="http://127.0.0.1:8123/v1"' in text and "KESTREL_API_KEY" in text
    plain = usage_banner("::1", 9, "m", has_key=False, has_tokenizer=False)
    assert "http://[::1]:9/v1/completions" in plain and '"prompt": [1, 2, 3]' in plain and "EMPTY" in plain
