#!/bin/bash
# (PDL became the default after this ran: the flags here are the current spelling of what ran then)
# Call 5 (diagnostic): where the planned side's time goes at batch 64 (per bucket and mode: steps, requests and
# tokens a step, step and verify ms; the guard's measured rates).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 64 --out $OUT/sweep64.json > $OUT/sweep64.log 2>&1; echo "rc=$?"; grep -E "batch|bucket|guard" $OUT/sweep64.log
