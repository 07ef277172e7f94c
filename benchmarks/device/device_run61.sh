#!/bin/bash
# Session of 2026-12-01, 04:18, call 3: issue 8's batch-1 comparison measured from each request's first token to
# its last (prefill excluded), plain with and without the overlap scheduler; the host profile of both modes with
# each step's graph timed alone.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec; timeout -k 5 240 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s host; timeout -k 5 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 12 > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "== plain|== dspark|profiled|GPU kernels|graph alone"
s done
