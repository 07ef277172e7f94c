#!/bin/bash
# 2026-12-07 16:37 session (issue 9). The one-row GEMV with each row of its tile in its own warps
# (kestrel.ops.linear.triton.ROWS_IN_WARPS: the tile loaded as [rows, K / 256, 256]; offline sm_90 at 2048 x 2048,
# 1 barrier after the wait against 4, and 1 against 7 with the RMSNorm prologue): the GEMV kernel tests with it on,
# k3-mini's decode graph turn about, and a timeline of the default batch-1 step (charged time by kernel).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "GEMV kernel tests, ROWS_IN_WARPS on"
timeout 120 python3 -c "
import sys, pytest
import kestrel.ops.linear.triton as T
T.ROWS_IN_WARPS = True
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-n', '8', 'tests/gpu/test_linear_kernels.py']))
" > $OUT/wr_tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/wr_tests.log; grep -E "^FAILED|^ERROR" $OUT/wr_tests.log | head -8
s "decode_knobs k3-mini ROWS_IN_WARPS"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob kestrel.ops.linear.triton.ROWS_IN_WARPS=False,True > $OUT/knobs_wr.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_wr.log | tail -4
s "timeline, default batch-1 step"
timeout 120 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --timeline-batches 1 \
  --timeline-top 14 --out $OUT > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -vE "^\s*$" $OUT/timeline.log | tail -22
s done
