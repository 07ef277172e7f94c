"""Host time of a step's page table: the persistent host table synced as pages change (`HostPageTable.sync` +
`gather`, what the scheduler runs) against the table built from every request's whole page list (`page_phys`,
`padded_rows`, `int_tensor`: `scheduler.PERSISTENT_PAGE_TABLE = False`), both in the same run, taking turns.

    OMP_NUM_THREADS=1 python benchmarks/page_table.py [--batches 1,8,64,256] [--contexts 256,2048] [--steps 200]

Each request starts with `context` pages (page size 1: one page a token) and gains `--grow` pages a step (1: plain
decoding; 8: a verify block of gamma 7). Medians of per-step milliseconds; the ratio is old / new.
"""

import argparse
import os
import statistics
import sys
import time

from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.engine.batch import int_tensor, padded_rows  # noqa: E402
from kestrel.engine.page_table import HostPageTable  # noqa: E402
from kestrel.mem.pools import Memory  # noqa: E402


def run(batch: int, context: int, grow: int, steps: int) -> tuple[float, float]:
    reqs = [SimpleNamespace(rid=f"r{i}", pages=list(range(i * 100_000, i * 100_000 + context)), pages_epoch=0)
            for i in range(batch)]
    mem = Memory.__new__(Memory)  # (the static pools' page mapping alone: no buffers)
    table = HostPageTable(batch + 16, pad=0)
    times = {"old": [], "new": []}
    for step in range(2 * steps):
        for r in reqs:
            last = r.pages[-1]
            r.pages += range(last + 1, last + 1 + grow)
        width = max(len(r.pages) for r in reqs)
        side = "old" if step % 2 else "new"
        start = time.perf_counter()
        if side == "old":
            lists = [mem.page_phys(r.pages) for r in reqs]
            int_tensor(padded_rows(lists, width, 0), torch.int32).view(batch, width)
        else:
            table.gather(table.sync(reqs, mem, width), width)
        times[side].append(time.perf_counter() - start)
    return statistics.median(times["old"]) * 1e3, statistics.median(times["new"]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--contexts", default="256,2048")
    ap.add_argument("--grow", default="1,8")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    print("| batch | context | pages a step | whole lists (ms) | persistent table (ms) | ratio |")
    print("|---|---|---|---|---|---|")
    for context in map(int, args.contexts.split(",")):
        for batch in map(int, args.batches.split(",")):
            for grow in map(int, args.grow.split(",")):
                old, new = run(batch, context, grow, args.steps)
                print(f"| {batch} | {context} | {grow} | {old:.3f} | {new:.3f} | {old / new:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
