#!/bin/bash
# Session of 2026-11-30, 20:42, call 5 (validation): kda_chunked with 32-column gate programs as the default. Its
# GPU test; ours alone at H = 16 / 32 / 96 (fla's figures: call 4, device_run32.sh); the engine and model GPU
# tests (the prefill runs kda_chunked) with durations.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s chunk; timeout -k 5 50 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 16,32,96 --no-fla > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|kernel time per call|^  " $OUT/kernels.log | grep -v "host:\|gpu:" | head -24
s "engine+model"; timeout -k 5 200 python3 -m pytest -v -p no:cacheprovider --tb=short --durations=0 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|s call" $OUT/t_em.log | head -40
s done
