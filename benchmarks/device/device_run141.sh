#!/bin/bash
# Session of 2026-12-04, 16:29, call 5: all GPU tests on the session's tree (reused pinned result buffers, the
# persistent host page table); the persistent table on and off at batch 64 with 1024-token prompts (long tables);
# the batch-1 served case at 128 new tokens over 24 prompts per held-out set.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 240 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s "host_timers batch 64, 1024-token prompts"
timeout 200 python3 benchmarks/host_timers.py --modes plain+overlap --rounds 3 --new-tokens 128 --prompt-len 1024 \
  --prompts 64 --batch 64 --knob kestrel.engine.model_runner.PERSISTENT_PAGE_TABLE=True,False \
  > $OUT/host_timers64.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_timers64.log | grep -E "^==|EngineCore.step|ModelRunner.run|run_host|graph alone|ratios"
s "spec 128 x 24"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
