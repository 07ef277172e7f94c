#!/bin/bash
# Session of 2026-11-30, 22:06, call 5: after call 4 (store_latent, q_rope in place), MLA's absorbed projections
# as per-head GEMVs (head_gemv) and its q LoRA norm as a GEMV prologue. Their kernel tests; the engine and model GPU
# tests; the decode ladder with the new last stage.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "mla or store_latent or head_gemv or linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 220 python3 -m pytest -q -p no:cacheprovider --tb=short --durations=5 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|s call" $OUT/t_em.log | head -20
s ladder; timeout 200 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^interleaved|verify step|Error|floor" $OUT/ladder_stdout.log | head -40
s done
