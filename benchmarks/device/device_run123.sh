#!/bin/bash
# Session of 2026-12-03, 18:42, call 4: context lookup on by default (auto = on) after calls 2 and 3 measured it at
# 1.04x and 1.08x of off at batch 1. The whole GPU suite (the confidence kernel's test with fan-in scaled weights:
# call 3's fp32 case had a saturated sigmoid); throughput against batch size with lookup on and off (16 and 64: where
# the verify planner may prune, whose pruning reads DSpark's confidences also for blocks that took a lookup).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s suite
timeout 200 python3 -m pytest -q -n 8 tests/gpu > $OUT/suite.log 2>&1
echo "rc=$?"; tail -2 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -20
for lk in on off; do
  s sweep-$lk
  timeout 120 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 3 --prompts 12 \
    --batches 16,64 --rounds 2 --context-lookup $lk > $OUT/sweep_$lk.log 2>&1
  echo "rc=$?"; grep -aoE "batch +[0-9]+:.*|planner at bucket.*" $OUT/sweep_$lk.log
done
s done
