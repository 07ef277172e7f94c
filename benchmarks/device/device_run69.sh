#!/bin/bash
# Session of 2026-12-01, 06:00, call 6 (last): greedy acceptance of the speculative step as one kernel
# (kestrel.ops.dspark.accept_greedy). GPU tests of the new kernels and the speculative engine tests; host_profile's
# step graph and phases; section 2 of the speculative benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/gpu/test_kernels.py -k "accept or dspark or linear or head_gemv" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_k.log | head -20
timeout -k 5 130 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py -k "speculative" > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_e.log | head -20
s host; timeout -k 5 80 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 30 --modes plain,dspark > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |GPU kernels|graph alone|phases|Error"
s spec; timeout -k 5 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
