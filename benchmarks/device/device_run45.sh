#!/bin/bash
# Session of 2026-11-30, 23:49, call 5: the GPU suite (the routed-experts test now synchronises after routing,
# as ids_ready promises), the ladder with the expert-GEMV tile sweep, the engine and model files.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout -k 5 200 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --tile-sweep --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| CUDA graph, \+ (prog|MLA abs|expert|MoE settle)|tile sweep|Error" $OUT/ladder_stdout.log | head -40
s "engine+model"; timeout -k 5 230 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s done
