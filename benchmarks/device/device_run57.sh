#!/bin/bash
# Session of 2026-12-01, 02:47, call 3: the tree to commit (the paired MoE tail; the speculative step reading its
# drafts with the verify's tokens, one sync a step below the planner): the model and engine GPU tests, then issue
# 8's batch-1 comparison with every prompt's prefill compiled before either side is timed, and the host profile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "engine+model"; timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s spec; timeout -k 5 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "plain .*tok/s|identical|one speculative|Error" $OUT/spec.log
s host; timeout -k 5 120 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 30 > $OUT/host.log 2>&1
echo "rc=$?"; grep -E "^== |profiled|== plain|== dspark" $OUT/host.log | sed 's/.*\r//'
s done
