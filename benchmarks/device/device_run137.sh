#!/bin/bash
# Session of 2026-12-04, 16:29, call 1: the GPU tests after the review's module split (f9ba188, checked under the
# Triton interpreter only); where a served speculative step's host time goes (host_timers); the served case at 128
# new tokens over 24 prompts of each held-out set (a longer timed decode than the 6 of before).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 240 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s host_timers
timeout 150 python3 benchmarks/host_timers.py --modes plain+overlap,dspark+overlap --rounds 3 --new-tokens 128 \
  > $OUT/host_timers.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_timers.log | head -80
s "spec 128 x 24"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
