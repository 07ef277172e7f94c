#!/bin/bash
# Session of 2026-12-01, 14:26, call 2: per-function host wall time of a batch-1 decode step, graph launch costs.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s timers; timeout -k 5 200 python3 benchmarks/host_timers.py --device cuda --dtype bfloat16 --modes plain,plain+overlap,dspark,dspark+overlap > $OUT/timers.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/timers.log | grep -v "loading weights" | grep -E "^== |^   |Error"
s done
