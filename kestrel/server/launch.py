"""Start `kestrel serve` in a subprocess on a free port and wait until it is healthy (bench, benchmarks, tests)."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LaunchedServer:
    """`with LaunchedServer(["--model", "k3-tiny"]) as srv: httpx.get(srv.url + "/health")`; the log is kept in a
    file (srv.log()) and shown when start-up fails. Leaving the block sends SIGTERM and waits for a clean exit."""

    def __init__(self, flags: list[str], host: str = "127.0.0.1", port: int | None = None, env: dict | None = None,
                 timeout: float = 180.0, api_key: str | None = None):
        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.timeout, self.api_key = timeout, api_key
        self.cmd = [sys.executable, "-m", "kestrel.cli", "serve", "--host", host, "--port", str(self.port), *flags]
        if api_key:
            self.cmd += ["--api-key", api_key]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="kestrel-serve-", suffix=".log", delete=False)

    def __enter__(self) -> "LaunchedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and remove its log."""
        self.stop()
        if not self._log.closed:
            self._log.close()
            os.unlink(self._log.name)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                # ready: healthy, and the usage banner is out
                if httpx.get(self.url + "/health", timeout=2).status_code == 200 and "Kestrel is serving" in self.log():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the server was not healthy after {self.timeout:.0f} s:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
