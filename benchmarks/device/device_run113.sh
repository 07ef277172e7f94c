#!/bin/bash
# Session of 2026-12-03, 12:11, call 1: L2 prefetch of the MoE's later weights (moe_ops.L2_PREFETCH bits: 1 the up
# GEMV asks L2 for its experts' down projections, 2 the front GEMV for the paired tail's weights), turn about.
# (The knob was reverted after this call: L2 prefetch did not pay. See docs/kernels.md, session of 2026-12-03 12:11.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py tests/gpu/test_linear_kernels.py -k "moe or route or linear or gemv or pair" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
timeout -k 5 300 python3 benchmarks/decode_knobs.py --knob kestrel.ops.moe.L2_PREFETCH=0,1,2,3 \
  --preset k3-mini --batches 1,2 --rounds 6 > $OUT/knob.log 2>&1
echo "rc=$?"; grep -E "^\||bit|rel" $OUT/knob.log | head -30
