#!/bin/bash
# Session of 2026-11-30, 23:49, call 6 (validation of the final tree): the expert and settle kernel tests, the
# engine and model files, then the ladder (expert tiles up 8 / down 4; settle in the router GEMV off by default).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 90 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe or route or settle or attn_res or linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s ladder; timeout -k 5 110 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |timeline \(" $OUT/ladder_stdout.log | head -50
s done
