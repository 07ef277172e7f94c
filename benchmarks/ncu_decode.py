"""One k3-mini batch-1 decode step (random bf16 weights, fused projections, the engine's kernels) inside a CUDA
profiler range, for Nsight Compute: each kernel of the step measured alone (serialised, so the programmatic
dependent launch overlap is gone): its duration, achieved occupancy, DRAM throughput and where its warps stall.

  PYTHONPATH=. ncu --profile-from-start off -k regex:'_attn_res|_gemv_up|_gemv_down|_kda_prep|_gemv_kernel' \\
      --launch-count 48 --csv --metrics <durations, DRAM throughput, occupancy, stall reasons> \\
      python3 benchmarks/ncu_decode.py > ncu.csv && python3 benchmarks/ncu_table.py ncu.csv

(benchmarks/device/device_run51.sh has the metric list. The kernels are launched plainly; the step's first 48 matching
launches cover its first three layers.)
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    args = ap.parse_args()
    cfg = preset_config(args.preset)
    model = build_model(cfg)
    model.fuse_projections()
    setup = DecodeSetup(cfg, 1, args.ctx, args.page_size)
    fb = setup.batch_fb()
    for _ in range(3):  # compile and warm every kernel outside the range
        model(fb)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    model(fb)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled one decode step")


if __name__ == "__main__":
    main()
