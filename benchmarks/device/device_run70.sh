#!/bin/bash
# Session of 2026-12-01, 08:30, call 1: speculative verify steps chained onto the one in flight (overlap scheduler).
# GPU engine tests (chained steps against plain decoding; the step graph against host acceptance, planner off);
# host_profile's batch-1 step with and without chaining; section 2 of the speculative benchmark (four sides).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 230 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
s host; timeout -k 5 110 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 12 --modes plain,plain+overlap,dspark,dspark+overlap > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |profiled|GPU kernels|graph alone|phases|Error"
s spec; timeout -k 5 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
