#!/bin/bash
# Session of 2026-12-01, 02:47, call 1: the MoE tail's two GEMVs (latent up + shared down) as one paired launch,
# wide GEMVs (K = 8192) loading whole tiles of fewer rows; kernel and model tests, the ladder with the two new
# stages, and where batch-1 engine steps spend host time (plain and DSpark; issue 8).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "linear or moe" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s model; timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py > $OUT/t_m.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_m.log | head -20
s ladder; timeout -k 5 220 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|PDL graph bit-equal|vs |interleaved|verify step|Error|error" $OUT/ladder_stdout.log | tail -24
grep -A14 "timeline (+ wide tiles whole): " $OUT/decode_ladder.log | head -15
s host; timeout -k 5 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 30 > $OUT/host.log 2>&1
echo "rc=$?"; grep -E "^== |profiled" $OUT/host.log
s done
