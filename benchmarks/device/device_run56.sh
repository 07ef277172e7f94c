#!/bin/bash
# Session of 2026-12-01, 02:47, call 2: the KDA gate's up projection inside the prep kernel (one GEMV fewer per KDA
# layer), the wide GEMV's activation in or apart; kernel and model tests, the ladder, and issue 8's batch-1
# DSpark against plain decoding with the step's phases.
# (The gate-in-prep and wide-tile variants measured within noise and were removed after this call; their diffs are
# in runs/device56, which git ignores.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "kda or linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s model; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py > $OUT/t_m.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_m.log | head -20
s ladder; timeout -k 5 220 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|PDL graph bit-equal|vs |interleaved|verify step|Error|error" $OUT/ladder_stdout.log | tail -20
grep -A12 "timeline (+ wide, act apart): " $OUT/decode_ladder.log | head -13
s spec; timeout -k 5 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "plain .*tok/s|identical|one speculative|Error" $OUT/spec.log
s done
