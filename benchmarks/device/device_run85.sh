#!/bin/bash
# Session of 2026-12-01, 23:10, call 1: section 2 of the speculative benchmark with its stall watch, after the engine
# start-up collects and freezes the heap (call 84 found 0.95-1.04 s cyclic collections inside DSpark engines' steps
# when earlier engines had run in the same process); then the GPU engine and model tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec; timeout -k 5 260 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|timed runs|Error"
s tests; timeout -k 5 300 python3 -m pytest -q -x tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -5 $OUT/tests.log
s done
