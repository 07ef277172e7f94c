#!/bin/bash
# Prepared 2026-12-05: issue 8's batch-1 served ratio on the H200 with launches of at most 1, 2 (the default) and 3
# verify steps, 24 prompts (section 2 needs ~250 s on a slow host: run it alone in one call).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "spec 128 x 24"
timeout 290 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos --launch-steps 1,3 > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|verify steps a launch|tokens per verify|identical|end to end" $OUT/spec128.log | cut -c1-700
s done
