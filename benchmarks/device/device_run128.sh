#!/bin/bash
# Session of 2026-12-04, 12:31, call 2: the greedy step graph's kernels in order (host_profile --timeline), to see
# which of its ~206 launches are torch's small ops (no PDL: each breaks the chain) and what each is charged.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s timeline
timeout 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark+overlap,plain+overlap \
  --prompts 2 --new-tokens 48 --context-lookup on --top 5 --timeline > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|timeline \(.*" $OUT/timeline.log
grep -a -A32 "charged time by kernel" $OUT/timeline.log | head -70
s done
