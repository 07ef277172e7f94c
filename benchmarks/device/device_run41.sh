#!/bin/bash
# Session of 2026-11-30, 23:49, call 1: the GPU suite on the tree (the settle inside the GEMV that reads it, the
# routing inside the expert GEMVs, and the previous session's unvalidated changes), then the decode ladder.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 170 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s ladder; timeout -k 5 240 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| CUDA graph, \+ (MLA abs|expert GEMVs|MoE settle|mixer settle)|timeline" $OUT/ladder_stdout.log | head -40
s done
