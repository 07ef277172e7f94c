#!/bin/bash
# 2026-12-07 16:37 session (issue 9), on the H200 if lent: launch settings re-timed on the tree with the one-layout
# settle and the channel-column KDA prep, k3-mini batch-1 decode graph, turn about, one knob at a time.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for knob in kestrel.ops.attn_res.triton.WARPS=None,4,16 kestrel.ops.moe.triton.GEMV_DOWN_ROWS=4,2,8 \
            kestrel.ops.kda.triton.RECUR_BV=32,16,64; do
  s "decode_knobs $knob"
  timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 6 --knob $knob \
    > $OUT/knobs_${knob##*.}.log 2>&1
  echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_${knob##*.}.log | tail -3
done
s done
