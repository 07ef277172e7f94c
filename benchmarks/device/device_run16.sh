#!/bin/bash
# Call 6 (last of the session's budget): the batch-64 sweep after the fixes call 5 pointed to (fold graphs captured
# at start-up, confidence only on pruning steps, prefills kept out of the guard), PDL on by default now; 64 new
# tokens a request in the timed window (call 5's 0.3 s windows were too short).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 140 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64 --new-tokens 128 --out $OUT/sweep64.json > $OUT/sweep64.log 2>&1; echo "rc=$?"; grep -E "batch|bucket|guard" $OUT/sweep64.log
