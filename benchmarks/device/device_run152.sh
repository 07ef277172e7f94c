#!/bin/bash
# Session of 2026-12-04, 20:25, call 4: the final tree (launches of two verify steps, auto on CUDA): all GPU tests,
# and the batch-1 served ratio with launches of at most 1, 2 (the default) and 3 steps (speculative.py section 2).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 200 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | cut -c1-600 | head -20
s "spec 128 x 16"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 16 --stop-at-eos --launch-steps 1,3 > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|verify steps a launch|tokens per verify|identical|end to end" $OUT/spec128.log | cut -c1-700
s done
