#!/bin/bash
# 2026-12-07 18:14 session (issue 9): device_run181.sh's first stage alone (the session's device time was down to
# ~4 minutes after ten refused starts): k3-mini's batch-1 decode graph with the router's logits formed in the
# AttnRes settle (kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS) against the router GEMV, turn about.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 170 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 5 \
  --knob kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS=0,8 > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^batch|^\| [0-9]|Error" $OUT/knobs.log | tail -8
