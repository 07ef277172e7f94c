#!/bin/bash
# 2026-12-07 16:37 session (issue 9), on the H200 if lent: the expert up GEMV with 8 warps (H100, 2026-12-05:
# 1.010x) turn about, then the default batch-1 decode graph against the floor again.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "decode_knobs k3-mini UP_WARPS"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 8 \
  --knob kestrel.ops.moe.triton.UP_WARPS=4,8 > $OUT/knobs_up.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_up.log | tail -2
s "batch-1 decode graph, default kernels"
timeout 80 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|^\| 1 " $OUT/ladder.log | head -4
s done
