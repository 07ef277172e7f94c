#!/bin/bash
# Session of 2026-12-01, 14:26, call 7: future token references resolved inside the decode graph. The GPU engine
# test against the reference path (overlap on and off), then host timers of plain decoding with and without overlap.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py -k "reference_path or pending" > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
s timers; timeout -k 5 100 python3 benchmarks/host_timers.py --device cuda --dtype bfloat16 --rounds 5 --modes plain,plain+overlap,dspark+overlap > $OUT/timers.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/timers.log | grep -v "loading weights" | grep -E "^== |Scheduler.step |graph alone|Error|ratios"
s done
