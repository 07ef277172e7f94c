#!/bin/bash
# Session of 2026-12-01, 19:20, call 2: the GPU tests after the host-integer packing (int_tensor) and the packed KDA
# conv (PackedConvWindows runs on the GPU's prefill too), then which batch-1 steps stall (~1 s gaps seen in
# DSpark's end-to-end runs, call 1).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s model; timeout -k 5 140 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py > $OUT/t_m.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_m.log | head -20
s engine; timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider --tb=short --durations=6 tests/gpu/test_engine_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error|s call" $OUT/t_e.log | head -20
s slow; timeout -k 5 130 python3 benchmarks/slow_steps.py --device cuda --dtype bfloat16 --threshold-ms 30 > $OUT/slow.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/slow.log | grep -v "loading weights" | head -40
s done
