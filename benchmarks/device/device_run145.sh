#!/bin/bash
# Session of 2026-12-04, 17:53, call 2: the KDA recurrence's warps per program (kda.triton.RECUR_WARPS; decode,
# verify and fold launch the same setting) and its column block (RECUR_BV): the speculative step graph, k3-small's
# decode and verify graphs, k3-mini's decode graph; the KDA kernel tests under 1 and 2 warps.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s step_knobs
timeout 170 python3 benchmarks/step_knobs.py --knob kestrel.ops.kda.triton.RECUR_WARPS=4,2,1 \
  --knob kestrel.ops.kda.triton.RECUR_BV=32,16,64 > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -8 $OUT/step_knobs.log
s "decode_knobs k3-small"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-small --batches 1,8,64 --verify-block 8 \
  --knob kestrel.ops.kda.triton.RECUR_WARPS=4,2,1 > $OUT/decode_small.log 2>&1
echo "rc=$?"; grep "^|" $OUT/decode_small.log | tail -14
s "decode_knobs k3-mini"
timeout 130 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,64 --rounds 6 \
  --knob kestrel.ops.kda.triton.RECUR_WARPS=4,2,1 > $OUT/decode_mini.log 2>&1
echo "rc=$?"; grep "^|" $OUT/decode_mini.log | tail -8
for w in 1 2; do
  s "kda kernel tests, RECUR_WARPS=$w"
  timeout 100 python3 -c "
import sys, pytest, kestrel.ops.kda.triton as t
t.RECUR_WARPS = $w
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/gpu/test_kernels.py', '-k', 'kda']))" > $OUT/tests_w$w.log 2>&1
  echo "rc=$?"; tail -1 $OUT/tests_w$w.log
done
s done
