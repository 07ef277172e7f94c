#!/bin/bash
# Second device call of the afternoon: split KDA recurrence (prep + recurrence kernels shared by decode, verify and
# fold), GEMV at one row only, MoE GEMV tiles; the ladder, DSpark batch 1 (with its phase breakdown) and the
# batch sweep to 256 on the H200.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=line tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py -k "verify or kda_decode or linear or moe or graph" > $OUT/t_kernels.log 2>&1; echo "rc=$?"; grep -E "^(/|E )|Error|assert|passed|failed" $OUT/t_kernels.log | head -20
s ladder; timeout 150 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|graph vs|kernel time|^  |verify step" $OUT/ladder_stdout.log | head -40
s spec; timeout 270 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2,3 --batches 1,16,64,256 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -v Warn $OUT/spec.log | tr '\r' '\n' | grep -E "^ |^[0-9]" | tail -12
s engine; timeout 45 python3 -m pytest -q -p no:cacheprovider --tb=line tests/gpu/test_engine_gpu.py -k "speculative and not True" > $OUT/t_engine.log 2>&1; echo "rc=$?"; tail -2 $OUT/t_engine.log
s done
