#!/bin/bash
# Call 7 (last) of the 17:25 session: batch-1 DSpark against plain decoding, and the batch 64 / 256 sweep with
# three rounds a side (the planner against verify-all), on the session's final code.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s b1; timeout 100 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 --out $OUT/b1.json > $OUT/b1.log 2>&1; echo "rc=$?"; grep -E "plain .*tok/s|identical|one speculative" $OUT/b1.log
s sweep; timeout 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64,256 --new-tokens 256 --rounds 3 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "   batch|planner at|guard|pruned" $OUT/sweep.log | tail -14
s done
