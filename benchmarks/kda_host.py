"""Host-side cost of one kda_chunked call without its kernels: the cached chunk table's lookup, the workspace
allocations and views, argument handling. The five launches (`launch`) are replaced by no-ops and the tensors live
on the meta device (no memory, allocation as cheap as a caching allocator's), so this runs on any CPU and times only
the Python and torch dispatch the GPU waits on before the first kernel (plus what follows it).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/kda_host.py [--heads 96] [--profile]

The pinned copy of the table (made once per batch layout) and the launches themselves are not in it: time those on
the device (benchmarks/kernels.py prints a host / GPU timeline of one call and the host variants).
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import hot_loop_us  # noqa: E402
from kestrel.ops.kda import triton_chunk as tc  # noqa: E402
from kestrel.ops.kda.layout import chunk_table  # noqa: E402



def per_call_us(fn, calls: int = 200) -> tuple[float, float]:
    """(min, median) over 7 rounds of the mean microseconds per call."""
    runs = hot_loop_us(fn, calls)
    return min(runs), statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=96)
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of 500 calls")
    args = ap.parse_args()
    saved, tc.launch = tc.launch, lambda fn, grid, *args, **meta: None
    try:
        T, H, K = 8192, args.heads, 128
        cu, starts = [0, 1000, 4000, 4192, 8192], [0, 0, 0, 0]
        q = torch.empty(T, H, K, dtype=torch.bfloat16, device="meta")
        g, beta = torch.empty(T, H, K, device="meta"), torch.empty(T, H, device="meta")
        h0 = torch.empty(len(cu) - 1, H, K, K, device="meta")

        def call():
            return tc.kda_chunked(q, q, q, g, beta, cu_seqlens=cu, initial_state=h0)

        lo, med = per_call_us(call)
        print(f"kda_chunked host work without launches (T = {T}, 4 sequences, H = {H}): min {lo:.1f} us, "
              f"median {med:.1f} us a call")
        lo, med = per_call_us(lambda: chunk_table(cu, starts, 64), calls=2000)
        print(f"  building the chunk table (once per batch layout, then cached; not in the figure above): min {lo:.1f} "
              f"us, median {med:.1f} us")
        if args.profile:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(500):
                call()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    finally:
        tc.launch = saved


if __name__ == "__main__":
    main()
