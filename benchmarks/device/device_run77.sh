#!/bin/bash
# Session of 2026-12-01, 14:26, call 6: overlapped batches launched from the scheduler's thread on a GPU (no forward
# thread). GPU engine tests; host timers with the four modes taking turns; section 2 of the speculative benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
s timers; timeout -k 5 200 python3 benchmarks/host_timers.py --device cuda --dtype bfloat16 --rounds 5 --modes plain,plain+overlap,dspark,dspark+overlap > $OUT/timers.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/timers.log | grep -v "loading weights" | grep -E "^== |Scheduler.step |graph alone|Error|ratios"
s spec; timeout -k 5 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
