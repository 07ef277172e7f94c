#!/bin/bash
# Session of 2026-12-01, 01:16, call 1: L2 prefetch (the settles ask L2 for their sublayer's weights, the router
# GEMV's last program for the chosen experts): the kernel tests it touches, the engine and model files, then the
# ladder with its prefetch stages (and the verify step with routing-first at 8 tokens, 93346ed).
# (The L2 prefetch code this call measured was reverted; the ladder stages it names are gone.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 120 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe or route or router or settle or attn_res or linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 220 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s ladder; timeout -k 5 200 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |timeline \(|L2 plan|verify step|Error|error" $OUT/ladder_stdout.log | head -60
s done
