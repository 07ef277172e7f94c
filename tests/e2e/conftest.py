"""A real `kestrel serve` on k3-tiny (float32) in a subprocess on a free port, and the offline Engine to compare
it with. The preset speaks through the bundled tokenizer; before that exists, a development tokenizer is trained
on a slice of the standard library."""

import re
import time
from pathlib import Path

import httpx
import pytest

from kestrel.server.launch import LaunchedServer
from tests.server.tokenizers import tokenizer_dir

CONTEXT = 512
MODEL_FLAGS = ["--model", "k3-tiny", "--dtype", "float32", "--context-length", str(CONTEXT)]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path | None:
    return tokenizer_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def server_flags(tokenizer_path) -> list[str]:
    return MODEL_FLAGS + (["--tokenizer-path", str(tokenizer_path)] if tokenizer_path else [])


@pytest.fixture(scope="session")
def server(server_flags):
    srv = LaunchedServer(server_flags, env=ENV)
    srv.start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()[-3000:]
    srv.close()


@pytest.fixture(scope="session")
def engine(tokenizer_path):
    from kestrel import Engine

    kw = {"tokenizer_path": str(tokenizer_path)} if tokenizer_path else {}
    with Engine("k3-tiny", dtype="float32", context_length=CONTEXT, **kw) as e:
        yield e


@pytest.fixture(scope="session")
def model_name() -> str:
    return "k3-tiny"


def metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """The server's Prometheus text as {name or name{labels}: value} (model_name labels dropped)."""
    text = httpx.get(url + "/metrics", headers=headers or {}, timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        key = re.sub(r'model_name="[^"]*",?', "", key).replace("{}", "").replace(",}", "}")
        out[key.removeprefix("kestrel:")] = float(value)
    return out


def wait_idle(url: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll /metrics until no request runs or waits and the pools hold only what the prefix cache owns."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        idle = (m["num_running_reqs"] == 0 and m["num_waiting_reqs"] == 0
                and m["kv_pages_used"] == m["kv_pages_cached"] and m["state_slots_used"] == m["state_slots_cached"])
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.1)
