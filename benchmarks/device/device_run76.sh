#!/bin/bash
# Session of 2026-12-01, 14:26, call 5: one copy of a step's integers (plain decode straight into the graph's
# static inputs, pageable non-blocking copies), no float logits for an all-greedy argmax. GPU engine and model tests,
# the host cost of the plumbing's parts, host timers with the four modes taking turns.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
s copies; timeout -k 5 60 python3 benchmarks/host_copies.py 2>&1 | tail -16
s timers; timeout -k 5 250 python3 benchmarks/host_timers.py --device cuda --dtype bfloat16 --rounds 3 --modes plain,plain+overlap,dspark,dspark+overlap > $OUT/timers.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/timers.log | grep -v "loading weights" | grep -E "^== |^   |Error|ratios"
s done
