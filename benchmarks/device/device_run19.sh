#!/bin/bash
# Call 3 of the 17:25 session: correctness of the day's kernel changes in the engine (the engine + model tests
# timed out in call 2 while Triton compiled: a longer limit here; the PDL race test is among them), the kernel
# tests, and the throughput sweep with the confidence head run once over the drafted positions.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 90 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 360 python3 -m pytest -v -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/t_em.log | sed 's/.*:://' | head -20
s sweep; timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64,256 --new-tokens 256 --rounds 2 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "batch|planner at|guard|pruned" $OUT/sweep.log | tail -16
s done
