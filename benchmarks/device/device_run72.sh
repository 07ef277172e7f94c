#!/bin/bash
# Session of 2026-12-01, 14:26, call 1: where the chained speculative step's host time goes (cProfile, batch 1).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s host; timeout -k 5 200 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 45 --modes plain,dspark+overlap > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |profiled|GPU kernels|graph alone|phases|Error"
s done
