#!/bin/bash
# Session of 2026-12-01, 23:10, call 2: where a batch-1 prefill's host time goes on the H200 (bundled k3-small, bf16):
# how many launches go through Triton's Python launch path and what they cost.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s prefill; timeout -k 5 300 python3 benchmarks/prefill_profile.py --device cuda --dtype bfloat16 --lens 16,80 --top 45 > $OUT/prefill.log 2>&1
echo "rc=$?"; grep -E "jit.py|_launch|launch\(|triton|function calls|^\| " $OUT/prefill.log | head -40
s done
