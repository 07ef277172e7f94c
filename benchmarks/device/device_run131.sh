#!/bin/bash
# Session of 2026-12-04, 14:51, call 1: the drafter block's attention as a Triton kernel under PDL
# (dspark.block_attention), the captured features written by the next settle (no add), MLA verify reading its
# block's page-table row in place, resolve giving n and real, the fold reading int64 slots, the embedding and the
# first norm in one kernel; SMALL_TILE (wider GEMV tiles for small weights of many short rows) as a knob.
# All GPU tests; the step graph under each knob (step_knobs.py); k3-small's plain decode and verify graphs under
# SMALL_TILE and SHARED_STREAM (decode_knobs.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 300 python3 -m pytest -q -n 8 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s step_knobs
timeout 150 python3 benchmarks/step_knobs.py --knob kestrel.ops.dspark.BLOCK_ATTENTION=True,False \
  --knob kestrel.ops.moe.SHARED_STREAM=True,False --knob kestrel.ops.linear.triton.SMALL_TILE=0,4096,8192 \
  > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -9 $OUT/step_knobs.log
s decode_knobs
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-small --batches 1 --verify-block 8 \
  --knob kestrel.ops.linear.triton.SMALL_TILE=0,4096,8192 > $OUT/decode_knobs.log 2>&1
echo "rc=$?"; tail -9 $OUT/decode_knobs.log
s done
