#!/bin/bash
# Session of 2026-11-30, 19:22, call 5 (validation): kda_chunked with the tf32 inverse products and 16-column K
# pieces as defaults. Its GPU test, ours alone at H = 16 / 32 / 96 (fla's figures: call 4, device_run27.sh), then
# the engine / model GPU tests one by one (the prefill runs kda_chunked), with durations.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s chunk; timeout -k 5 60 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 16,32,96 --no-fla > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|kernel time per call|^  " $OUT/kernels.log | head -30
s "engine+model"; timeout -k 5 290 python3 -m pytest -v -p no:cacheprovider --tb=short --durations=0 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|s call" $OUT/t_em.log | head -40
s done
