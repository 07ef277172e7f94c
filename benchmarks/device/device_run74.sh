#!/bin/bash
# Session of 2026-12-01, 14:26, call 3: the step's copies through a pinned ring, decode integers straight into the
# graph's static inputs. GPU engine and model tests, then the host timers of call 2 again.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
s timers; timeout -k 5 200 python3 benchmarks/host_timers.py --device cuda --dtype bfloat16 --modes plain,plain+overlap,dspark,dspark+overlap > $OUT/timers.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/timers.log | grep -v "loading weights" | grep -E "^== |^   |Error"
s done
