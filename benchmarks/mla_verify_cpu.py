"""The CPU verify attention of one MLA layer: the per-token paged decode over the page table expanded to one row
per verify token (each token gathers its block's keys again) against the block form (`mla_verify_paged`: the keys
gathered once per block), k3-small's shapes (latent 128 + rope 32, 4 heads, page size 1, the engine's pool size),
one block of 8 tokens, contexts of --contexts keys. Both sides turn about in this one process; medians.

    OMP_NUM_THREADS=1 python benchmarks/mla_verify_cpu.py [--contexts 100,500,2000] [--calls 30]
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.ops.mla import reference as ref  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="100,500,2000")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    R, Dr, H, L = 128, 32, 4, 8
    buf = torch.randn(131073, 1, R + Dr)
    for S in map(int, args.contexts.split(",")):
        table = (torch.randperm(131072)[: S + 16] + 1).view(1, -1).to(torch.int32)
        keys = (torch.arange(L) + S - L + 1).to(torch.int32)
        q_lat, q_rope = torch.randn(L, H, R), torch.randn(L, H, Dr)
        sides = {"per-token decode": lambda: ref.mla_decode_paged(q_lat, q_rope, buf, table.expand(L, -1), keys, R, 0.1),
                 "block form": lambda: ref.mla_verify_paged(q_lat, q_rope, buf, table, keys, R, 0.1)}
        times = {k: [] for k in sides}
        for _ in range(args.calls):
            for k, fn in sides.items():
                start = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - start)
        a, b = (statistics.median(times[k]) * 1e3 for k in sides)
        print(f"context {S:5d}: per-token decode {a:.2f} ms, block form {b:.2f} ms: x{a / b:.2f}")


if __name__ == "__main__":
    main()
