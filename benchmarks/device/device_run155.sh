#!/bin/bash
# 2026-12-05 12:26 session: issue 8's batch-1 ratio on the H200 again (the engine's default launches only), to
# repeat call 154's x2.62 in a second call.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "spec 128 x 24"
timeout 250 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec128.log | cut -c1-700
s done
