#!/bin/bash
# Session of 2026-12-04, 14:51, call 4: the served batch-1 case on the committed tree with more prompts and tokens
# (section 2's decode portion was ~60 ms a side in calls 2 and 3, and its rounds moved by up to 30%).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec
timeout 400 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 24 \
  --new-tokens 128 --stop-at-eos > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end|timed runs" $OUT/spec.log | cut -c1-400 | head -20
s done
