#!/bin/bash
# Session of 2026-12-04, 17:53, call 6: where the served batch-1 step's host time goes on the final tree (DSpark
# with the one-launch fold and paired sums; plain), host_timers.py, batch 1, 128 new tokens.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s host_timers
timeout 170 python3 benchmarks/host_timers.py --modes plain+overlap,dspark+overlap --rounds 2 --new-tokens 128 \
  > $OUT/host_timers.log 2>&1
echo "rc=$?"; sed 's/.*\r//' $OUT/host_timers.log | grep -E "^==|EngineCore.step|Event.synchronize|resolve|_process_done|SpecWorker.run |_schedule|graph alone|ratios"
s done
