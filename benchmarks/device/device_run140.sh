#!/bin/bash
# Session of 2026-12-04, 16:29, call 4: step page tables gathered from a persistent host table written as pages
# change (model_runner.PERSISTENT_PAGE_TABLE; kestrel/engine/page_table.py): the engine GPU tests, then the served
# step's host time at batch 64 and batch 1 with the table on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_drafter_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s "host_timers batch 64"
timeout 240 python3 benchmarks/host_timers.py --modes plain+overlap,dspark+overlap --rounds 2 --new-tokens 256 \
  --prompts 64 --batch 64 --knob kestrel.engine.model_runner.PERSISTENT_PAGE_TABLE=True,False \
  > $OUT/host_timers64.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_timers64.log | grep -E "^==|EngineCore.step|ModelRunner.run|_host_ints|_schedule|_build|graph alone|ratios"
s done
