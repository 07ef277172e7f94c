#!/bin/bash
# Session of 2026-12-04, 14:51, call 5: each drafted position's correction computes its slot's and state's part
# before its wait (dspark EARLY_CORRECTION; the vocabulary kernel before it launches it late). All GPU tests (the
# new PDL-graph drafting test included) and the drafter's CUDA test; the step graph under the knob; the served
# case at 64 and 128 new tokens.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 240 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s step_knobs
timeout 90 python3 benchmarks/step_knobs.py --knob kestrel.ops.dspark.EARLY_CORRECTION=True,False \
  > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -4 $OUT/step_knobs.log
for n in 64 128; do
s "spec $n"
timeout 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens $n \
  --stop-at-eos > $OUT/spec$n.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec$n.log | cut -c1-400
done
s done
