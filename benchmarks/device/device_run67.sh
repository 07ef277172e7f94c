#!/bin/bash
# Session of 2026-12-01, 06:00, call 4: small weights' GEMVs (linear, pair, MLA head GEMV) give each of 2-8 input
# rows its own programs (each row then computes as a one-row launch does). GPU tests; the small-GEMV comparison;
# host_profile's step graph and phases; section 2 of the speculative benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/gpu/test_kernels.py -k "linear or dspark or head_gemv or mla" tests/spec/test_drafter.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_k.log | head -20
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short -n 2 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_e.log | head -20
s small; timeout -k 5 200 python3 benchmarks/small_gemv.py --out $OUT > $OUT/small.out 2>&1
echo "rc=$?"; grep -E "^\||Error" $OUT/small.out
s host; timeout -k 5 100 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 40 --modes plain,dspark > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |GPU kernels|graph alone|phases|Error"
s spec; timeout -k 5 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
