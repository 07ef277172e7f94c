#!/bin/bash
# Session of 2026-12-04, 16:29, call 6: the persistent host page table on and off at batch 64 with 1024-token
# prompts (call 5's run of this had too small a KV pool: ~4 requests decoded at a time).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "host_timers batch 64, 1024-token prompts"
timeout 170 python3 benchmarks/host_timers.py --modes plain+overlap --rounds 2 --new-tokens 64 --prompt-len 1024 \
  --prompts 64 --batch 64 --knob kestrel.engine.model_runner.PERSISTENT_PAGE_TABLE=True,False \
  > $OUT/host_timers64.log 2>&1
echo "rc=$?"; sed 's/.*\r//' $OUT/host_timers64.log | grep -E "^==|EngineCore.step|ModelRunner.run|run_host|_check_finish|graph alone|ratios"
s done
