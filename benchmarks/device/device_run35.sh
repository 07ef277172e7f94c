#!/bin/bash
# Session of 2026-11-30, 22:06, call 1: kda_chunked through launch() (compiled kernels launched directly) with its
# device chunk table cached per layout. All kernel tests (the new near-zero-gate and misaligned-q cases in bf16),
# the engine and model GPU tests, then H = 96 against fla with the host variants (launch path, fresh layouts).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short --durations=5 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|s call" $OUT/t_em.log | head -20
s chunk; timeout -k 5 200 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 96 > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla|kernel time per call|host variants|^\| kda" $OUT/kernels.log | head -30
s done
