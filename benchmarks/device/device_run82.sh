#!/bin/bash
# Session of 2026-12-01, 19:20, call 3: where a batch-1 prefill's 30-38 ms goes on the H200 (call 2's slow_steps:
# every EXTEND of a 15-80 token prompt took 30-38 ms, against a 0.14 ms decode step), plain and with the drafter.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s plain; timeout -k 5 200 python3 benchmarks/prefill_profile.py --device cuda --dtype bfloat16 --lens 16,41,80,300 --top 30 > $OUT/plain.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/plain.log | grep -v "loading weights" | grep -E "^\|| ms|Error" | tail -8
s dspark; timeout -k 5 200 python3 benchmarks/prefill_profile.py --device cuda --dtype bfloat16 --lens 16,41,80,300 --top 30 --speculative > $OUT/dspark.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/dspark.log | grep -v "loading weights" | grep -E "^\|| ms|Error" | tail -8
s done
