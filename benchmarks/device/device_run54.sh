#!/bin/bash
# Session of 2026-12-01, 01:16, call 8: the committed tree's expert and routing kernel tests (the top-k routing in
# moe/triton.py's _route_row, as committed) and the PDL-vs-plain model test.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 100 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe or route" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s model; timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py -k "pdl" > $OUT/t_m.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_m.log | head -12
s done
