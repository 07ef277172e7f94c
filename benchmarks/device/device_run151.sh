#!/bin/bash
# Session of 2026-12-04, 20:25, call 2: launches of two greedy verify steps (speculative_launch_steps, auto 2 on
# CUDA) with the futures holding prefix lengths: GPU tests, the served step's layers with one and two steps a
# launch (served_step.py), the batch-1 served ratio with both (speculative.py section 2).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 250 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s served_step
timeout 150 python3 benchmarks/served_step.py --rounds 5 --steps 200 > $OUT/served_step.log 2>&1
echo "rc=$?"; tail -11 $OUT/served_step.log
s "spec 128 x 24"
timeout 180 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|one verify step|tokens per verify|identical" $OUT/spec128.log | cut -c1-600
s done
