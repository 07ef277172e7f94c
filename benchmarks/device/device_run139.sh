#!/bin/bash
# Session of 2026-12-04, 16:29, call 3: where a served step's host time goes at batch 64 (plain and DSpark with
# overlap; host_timers --batch, new), and the batch-1 served case at 128 new tokens over 24 prompts per held-out set
# with the reused pinned result buffers.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "host_timers batch 64"
timeout 200 python3 benchmarks/host_timers.py --modes plain+overlap,dspark+overlap --rounds 2 --new-tokens 256 \
  --prompts 64 --batch 64 > $OUT/host_timers64.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_timers64.log | head -80
s "spec 128 x 24"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
