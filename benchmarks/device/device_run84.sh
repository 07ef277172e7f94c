#!/bin/bash
# Session of 2026-12-01, 19:20, call 5: section 2 of the speculative benchmark with its stall watch (Python's cyclic
# garbage collections and the slowest step of each timed run): where the ~1 s gaps of DSpark's end-to-end runs come
# from (call 4: no caching-allocator retries).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec; timeout -k 5 250 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|timed runs|Error"
s done
