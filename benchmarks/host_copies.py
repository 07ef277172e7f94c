"""Host microseconds of the small operations a decode step's plumbing is made of (H200 host): building a tensor
from a list, copies both ways (pageable and pinned sources), events, a small kernel launch.

    python benchmarks/host_copies.py

Each row: the median over rounds of the mean host time per call in a hot loop (no device synchronisation inside).
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import hot_loop_us  # noqa: E402
from kestrel.engine import batch  # noqa: E402


def pending_resolve(d: torch.Tensor, reuse: bool) -> list[int]:
    """BatchResult.pending + resolve of one small result, with or without the reused pinned buffers and events."""
    old, batch.REUSE_PINNED = batch.REUSE_PINNED, reuse
    try:
        return batch.BatchResult.pending(d).resolve().tokens
    finally:
        batch.REUSE_PINNED = old


def main() -> None:
    dev = torch.device("cuda")
    ints = [list(range(i, i + 8)) for i in range(8)]
    host = torch.tensor(ints)
    row = list(range(300))
    table = torch.tensor([row], dtype=torch.int32)
    static = torch.zeros(8, 8, dtype=torch.long, device=dev)
    wide = torch.zeros(1, 4096, dtype=torch.int32, device=dev)
    d = torch.arange(16, device=dev)
    pinned = torch.empty(64, dtype=torch.long, pin_memory=True)
    event = torch.cuda.Event()
    cases = {
        "torch.tensor(8x8 list)": lambda: torch.tensor(ints),
        "torch.tensor(1x300 list, int32)": lambda: torch.tensor([row], dtype=torch.int32),
        "static[:, :300].copy_(pageable 1x300 int32, non_blocking)": lambda: wide[:, :300].copy_(table, non_blocking=True),
        "torch.tensor(8x8 list).to(cuda, non_blocking)": lambda: torch.tensor(ints).to(dev, non_blocking=True),
        "tensor.pin_memory().to(cuda, non_blocking)": lambda: host.pin_memory().to(dev, non_blocking=True),
        "static.copy_(pinned 64, non_blocking)": lambda: static.view(-1).copy_(pinned, non_blocking=True),
        "static.copy_(pageable 8x8, non_blocking)": lambda: static.copy_(host, non_blocking=True),
        "torch.empty(pin_memory) + copy_ D2H": lambda: torch.empty(16, dtype=torch.long, pin_memory=True).copy_(
            d, non_blocking=True),
        "BatchResult.pending + resolve, new pinned buffer and event": lambda: pending_resolve(d, False),
        "BatchResult.pending + resolve, reused (REUSE_PINNED)": lambda: pending_resolve(d, True),
        "torch.cuda.Event()": torch.cuda.Event,
        "event.record()": event.record,
        "event.record() + synchronize() (idle)": lambda: (event.record(), event.synchronize()),
        "tensor slice + view + view": lambda: pinned[:32].view(torch.int32).view(8, 8),
        "small device kernel (d.add_(1))": lambda: d.add_(0),
    }
    width = max(len(k) for k in cases)
    for name, fn in cases.items():
        us = statistics.median(hot_loop_us(fn, calls=200, rounds=5))
        torch.cuda.synchronize()
        print(f"   {name:{width}s} {us:8.2f} us")
    # the same copies issued while the device is still busy (~ms of queued work): a copy that waits for the device
    # takes about that long on the host
    x = torch.randn(4096, 4096, device=dev)
    busy = {
        "static.copy_(pageable 8x8, non_blocking)": lambda: static.copy_(host, non_blocking=True),
        "static[:, :300].copy_(pageable int32, non_blocking)": lambda: wide[:, :300].copy_(table, non_blocking=True),
        "tensor.pin_memory() then static.copy_(non_blocking)": lambda: static.copy_(host.pin_memory(), non_blocking=True),
        "torch.empty(pin_memory) + copy_ D2H": lambda: torch.empty(16, dtype=torch.long, pin_memory=True).copy_(
            d, non_blocking=True),
        "static.copy_(pinned 64, non_blocking)": lambda: static.view(-1).copy_(pinned, non_blocking=True),
        "BatchResult.pending, new pinned buffer and event": lambda: pend(False),
        "BatchResult.pending, reused (REUSE_PINNED)": lambda: pend(True),
        "graph-free small kernel": lambda: d.add_(0),
    }
    held = []

    def pend(reuse: bool) -> None:  # resolved after the device drains (below), so each reused buffer is free again
        old, batch.REUSE_PINNED = batch.REUSE_PINNED, reuse
        held.append(batch.BatchResult.pending(d))
        batch.REUSE_PINNED = old
    for name, fn in busy.items():
        times = []
        for _ in range(5):
            for _ in range(10):
                x = x @ x / 64
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
            start = time.perf_counter()
            torch.cuda.synchronize()
            queued = (time.perf_counter() - start) * 1e6
            while held:
                held.pop().resolve()
        print(f"   busy device: {name:{width}s} {statistics.median(times):8.2f} us (device still busy "
              f"{queued:.0f} us after it)")


if __name__ == "__main__":
    main()
