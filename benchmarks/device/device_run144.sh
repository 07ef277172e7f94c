#!/bin/bash
# Session of 2026-12-04, 17:53, call 1: what the served batch-1 DSpark step runs beyond its graph (host_profile.py
# --served-timeline, new), the batch-64 host step with the numpy gather of the host page table (not run on the H200
# before), and the batch-1 served ratio at 128 new tokens over 24 prompts a set.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "host_profile served timeline"
timeout 200 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark+overlap,plain+overlap \
  --prompts 4 --new-tokens 96 --context-lookup on --served-timeline --timeline --top 12 > $OUT/host_profile.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_profile.log | grep -A34 -E "^== |timeline \(" | grep -vE "^\s+[0-9]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+ /" | head -150
s "host_timers batch 64, 1024-token prompts"
timeout 120 python3 benchmarks/host_timers.py --modes plain+overlap --rounds 2 --new-tokens 64 --prompt-len 1024 \
  --prompts 64 --batch 64 --knob kestrel.engine.scheduler.PERSISTENT_PAGE_TABLE=True,False \
  > $OUT/host_timers64.log 2>&1
echo "rc=$?"; sed 's/.*\r//' $OUT/host_timers64.log | grep -E "^==|EngineCore.step|ModelRunner.run|_build|_schedule|_process|_reap|graph alone|ratios"
s "spec 128 x 24"
timeout 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
