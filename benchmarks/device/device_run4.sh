#!/bin/bash
# Device call (session of 2026-11-30, afternoon): the new verify / fold kernels and verify graphs, the GEMV
# linears, the decode ladder with its new stage, cold-weight GEMV tile sweeps, DSpark batch-1 on the H200.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "verify_and_fold or kda_decode or linear or moe" > $OUT/t_kernels.log 2>&1; echo "rc=$?"; tail -3 $OUT/t_kernels.log
s model; timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_model_gpu.py > $OUT/t_model.log 2>&1; echo "rc=$?"; tail -3 $OUT/t_model.log
s ladder; timeout 170 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|graph vs|kernel time|^  |verify step" $OUT/ladder_stdout.log
s spec; timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -v Warn $OUT/spec.log | tail -8
s cold; timeout 70 python3 benchmarks/kernels.py --out $OUT --sections cold > $OUT/cold_stdout.log 2>&1; echo "rc=$?"; grep -E "^(gemv|moe)" $OUT/cold_stdout.log
s engine; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine_gpu.py -k speculative > $OUT/t_engine.log 2>&1; echo "rc=$?"; tail -3 $OUT/t_engine.log
s done
