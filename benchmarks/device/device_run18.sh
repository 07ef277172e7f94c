#!/bin/bash
# Call 2 of the 17:25 session: expert weights streamed before the wait (the front GEMM launches its dependents
# late, so the routing is done when the expert kernels start), the ladder's last stages timed turn about, and the
# throughput sweep with the numpy planner, two rounds a side.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 110 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_em.log | head -12
s ladder; timeout 170 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^interleaved|^timeline|verify step" $OUT/ladder_stdout.log | head -24
s sweep; timeout 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64,256 --new-tokens 256 --rounds 2 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "batch|planner at|guard|pruned" $OUT/sweep.log | tail -16
s done
