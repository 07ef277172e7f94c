"""kda_chunked and fla's chunk_kda under Nsight Compute: one call each at T = 8192 (4 varlen sequences), K = V = 128,
bf16, after warm-up (compiles and fla's autotuning happen outside the profiled range).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_chunk.py --heads 96
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.kernels import chunk_case, fla_chunk  # noqa: E402
from kestrel.ops.kda import triton_chunk as kda_t  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=96)
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    case = chunk_case(args.heads)
    cu, q, k, v, g, beta, h0 = case
    runs = [lambda: kda_t.kda_chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)]
    if not args.no_fla:
        import fla.ops.kda as fla
        runs.append(fla_chunk(fla, case, safe=True))
    for run in runs:
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
