#!/bin/bash
# Session of 2026-11-30, 19:22, call 3: kda_chunked with one intra program per (chunk, head) accumulating 16 x 16
# blocks over K pieces and assembling (I + A)^-1, w / u0 as one product, one pinned table copy. Its GPU test, ours
# alone at H = 16 / 32 / 96 with a launch-shape sweep (fla's figures from calls 1-2), then the engine / model GPU
# tests (the prefill runs it).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s chunk; timeout -k 5 200 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 16,32,96 --chunk-sweep --no-fla > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|kernel time per call|^  |failed|Error" $OUT/kernels.log | head -80
s "engine+model"; timeout -k 5 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_em.log | head -12
s done
