#!/bin/bash
# Session of 2026-12-01, 06:00, call 1: the speculative step's kernels. Small linear layers (<= 1M weight elements)
# take the GEMV up to eight rows (a verify block, the drafter's block) under PDL with their prologues; the
# drafter's greedy corrections run as four kernels a position. GPU tests, then host_profile's kernel table and
# step-graph time for plain, DSpark and DSpark with both changes off, then section 2 of the speculative benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/gpu/test_kernels.py -k "linear or dspark" tests/spec/test_drafter.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_k.log | head -20
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py -k "speculative" tests/gpu/test_model_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_e.log | head -20
s host; timeout -k 5 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 30 --modes plain,dspark,dspark-unfused > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |GPU kernels|graph alone|Error"
s spec; timeout -k 5 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
