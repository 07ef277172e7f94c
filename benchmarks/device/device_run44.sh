#!/bin/bash
# Session of 2026-11-30, 23:49, call 4: the expert-GEMV test alone with blocking launches (call 1 saw a fault in
# it), the GPU suite, then the decode ladder with the MoE front end's fusion standing and the routing launched
# before it.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s routed; CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe_experts_routed or test_route" > $OUT/t_r.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/t_r.log | head -8
s kernels; timeout -k 5 150 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout -k 5 250 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| CUDA graph, \+ (prog|MLA abs|expert|MoE settle)|timeline \(|Error" $OUT/ladder_stdout.log | head -40
s "engine+model"; timeout -k 5 120 python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s done
