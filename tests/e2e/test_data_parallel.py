"""`kestrel serve --dp-size 2`: two core processes behind one front end; answers as one engine does, metrics summed
over both, and one replica's death makes the server unhealthy without orphaning the other."""

import os
import signal
from pathlib import Path

import httpx
import pytest

from kestrel.server.launch import LaunchedServer
from tests.e2e.conftest import ENV, wait_idle
from tests.e2e.test_generate import _same, _strip
from tests.e2e.test_lifecycle import _gone

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def core_pids(server_pid: int) -> list[int]:
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_two_replicas_serve_as_one_engine(server_flags, engine):
    prompts = [[1, 50 + i, 60, 70 + 2 * i] for i in range(5)]
    with LaunchedServer(server_flags + ["--dp-size", "2", "--load-balance-method", "shortest_queue"], env=ENV) as srv:
        cores = core_pids(srv.proc.pid)
        assert len(cores) == 2
        got = httpx.post(srv.url + "/generate", json={"input_ids": prompts, "sampling_params": GREEDY},
                         timeout=60).json()
        want = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        _same([_strip(g) for g in got], [_strip(w) for w in want])
        m = wait_idle(srv.url)
        assert m["generation_tokens_total"] == 5 * 8 and m["prompt_tokens_total"] == 5 * 4
        assert m["state_slots_total"] == 2 * engine.metrics()["state_slots_total"]
        # one replica dies: the server says so, refuses work, and a stop leaves no core behind
        os.kill(cores[1], signal.SIGKILL)
        assert _gone(cores[1])
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "engine core" in health.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503
        assert srv.stop(signal.SIGTERM) == 0
        assert _gone(cores[0])
        assert "shut down" in srv.log()
