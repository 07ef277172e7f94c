"""Shared helpers for the GPU benchmarks: timing, the copy-bandwidth ceiling, fast random init on the device."""

import math
import statistics
import time

import torch


def cuda_time(fn, warmup: int = 3, iters: int = 20) -> float:
    """Median seconds per call of fn, timed with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def graph_time(fn, iters: int = 50, reps: int = 5) -> float:
    """Median seconds per call of fn captured `iters` times in one CUDA graph (launch gaps shrink to the floor)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return cuda_time(g.replay, warmup=2, iters=reps) / iters


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    n = int(gib * (1 << 30)) // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    t = cuda_time(lambda: y.copy_(x), warmup=3, iters=10)
    del x, y
    return 2 * n * 4 / t


class Log:
    """Print and keep every line, so the full log lands under $OUT."""

    def __init__(self, path: str | None):
        self.path, self.lines = path, []

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.lines.append(s)
        if self.path:
            with open(self.path, "a") as f:
                f.write(s + "\n")


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
