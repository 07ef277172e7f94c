#!/bin/bash
# Session of 2026-11-30 evening, call 1: the GEMV prologues (activation, latent RMSNorm, KDA's gated output norm)
# and beta's sigmoid inside the KDA prep kernel; the planner's "no plan can pay" gate. GPU tests (kernels in 8
# workers, engine + model serially), the ladder with its graph timeline, then the throughput sweep at 64 and 256
# with longer timed windows.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 110 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_em.log | head -12
s ladder; timeout 150 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^timeline|kernel time|verify step" $OUT/ladder_stdout.log | head -20
s sweep; timeout 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64,256 --new-tokens 256 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "batch|planner at|guard" $OUT/sweep.log | tail -14
s done
