#!/bin/bash
# Session of 2026-12-01, 02:47, call 4: the drafter's RMSNorms as one kernel each when drafting on the GPU (about
# 30 norms a draft, each eight launches as the formula); the model and engine GPU tests, issue 8's batch-1
# comparison, and the host profile with the GPU kernels of a step.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "engine+model"; timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s spec; timeout -k 5 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "plain .*tok/s|identical|one speculative|Error" $OUT/spec.log
s host; timeout -k 5 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 16 > $OUT/host.log 2>&1
echo "rc=$?"; grep -E "== plain|== dspark|profiled|GPU kernels" $OUT/host.log | sed 's/.*\r//'
grep -A17 "GPU kernels" $OUT/host.log | tail -17
s done
