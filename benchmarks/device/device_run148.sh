#!/bin/bash
# Session of 2026-12-04, 17:53, call 5: the verify recurrence's paired sums (kda.triton.RECUR_PAIRED_SUMS: step t's
# output sum and step t + 1's delta-rule sum in one two-operand reduction): all GPU tests (bit-exactness of verify
# and fold against decode), the step graph with it on and off, the batch-1 served ratio.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 240 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s step_knobs
timeout 110 python3 benchmarks/step_knobs.py --knob kestrel.ops.kda.triton.RECUR_PAIRED_SUMS=True,False \
  > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -4 $OUT/step_knobs.log
s "spec 128 x 24"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
