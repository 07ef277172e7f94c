#!/bin/bash
# Session of 2026-12-04, 16:29, call 7: the host page table kept by the scheduler (rows synced with only the pages
# appended; scheduler.PERSISTENT_PAGE_TABLE): the engine and drafter GPU tests, then the table on and off at batch
# 64 with 1024-token prompts.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 150 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_drafter_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s "host_timers batch 64, 1024-token prompts"
timeout 80 python3 benchmarks/host_timers.py --modes plain+overlap --rounds 2 --new-tokens 64 --prompt-len 1024 \
  --prompts 64 --batch 64 --knob kestrel.engine.scheduler.PERSISTENT_PAGE_TABLE=True,False \
  > $OUT/host_timers64.log 2>&1
echo "rc=$?"; sed 's/.*\r//' $OUT/host_timers64.log | grep -E "^==|EngineCore.step|ModelRunner.run|_build|_schedule|graph alone|ratios"
s done
