"""A server of its own per test: the API key, clean shutdown on SIGINT / SIGTERM with a stream in flight, and a
dead engine core (unhealthy, 503s)."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from kestrel.server.launch import LaunchedServer
from tests.e2e.conftest import ENV

pytestmark = pytest.mark.e2e


def core_pid(server_pid: int) -> int:
    """The engine-core process: the server's child started by multiprocessing spawn."""
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError("no engine-core child process")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_api_key_and_sigint_with_a_stream_in_flight(server_flags):
    with LaunchedServer(server_flags, env=ENV, api_key="s3cret") as srv:
        assert "KESTREL_API_KEY" in srv.log() and "s3cret" not in srv.log()
        assert httpx.get(srv.url + "/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(srv.url + "/metrics").status_code == 401
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=srv.headers)
        assert r.status_code == 200
        core = core_pid(srv.proc.pid)
        body = {"prompt": "x", "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, headers=srv.headers, timeout=30) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            srv.proc.send_signal(signal.SIGINT)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and any("shutting down" in line for line in rest)
        assert srv.proc.wait(30) == 0
        assert _gone(core)
        assert "shut down" in srv.log()


def test_dead_core_is_unhealthy_and_503_then_sigterm_exits_cleanly(server_flags):
    with LaunchedServer(server_flags + ["--disable-radix-cache"], env=ENV) as srv:
        os.kill(core_pid(srv.proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and "engine core" in health.json()["error"]["message"]
        for route, body in (("/v1/completions", {"prompt": "x"}), ("/generate", {"text": "x"}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
            r = httpx.post(srv.url + route, json=body)
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
        assert srv.stop(signal.SIGTERM) == 0
        assert "shut down" in srv.log()


def test_sigterm_to_server_and_core_at_once_exits_without_tracebacks(server_flags):
    """What `kill` of the whole process group does: the core may be gone before the front end's shutdown message
    reaches it. The front end must still exit 0, and log no exception that nobody retrieved."""
    with LaunchedServer(server_flags + ["--disable-radix-cache"], env=ENV) as srv:
        assert httpx.get(srv.url + "/metrics").status_code == 200
        core = core_pid(srv.proc.pid)
        os.kill(core, signal.SIGTERM)
        assert srv.stop(signal.SIGTERM) == 0
        assert _gone(core)
        assert "shut down" in srv.log() and "Traceback" not in srv.log() and "never retrieved" not in srv.log()
