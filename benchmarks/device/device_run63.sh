#!/bin/bash
# Session of 2026-12-01, 04:18, call 5: the overlap scheduler against serial scheduling at batch 1 on k3-mini
# (random bf16 weights), one engine, interleaved rounds, beside its decode graph alone.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 230 python3 benchmarks/overlap.py --model k3-mini --device cuda --dtype bfloat16 --rounds 3 > $OUT/overlap.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/overlap.log | grep -vE "^\s*$|loading|init" | tail -8
