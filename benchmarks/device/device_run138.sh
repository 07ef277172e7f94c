#!/bin/bash
# Session of 2026-12-04, 16:29, call 2: results copied back into reused pinned buffers and events
# (batch.REUSE_PINNED): the engine GPU tests, the host primitives, and the served batch-1 step's host time with the
# pool on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s host_copies
timeout 60 python3 benchmarks/host_copies.py > $OUT/host_copies.log 2>&1
echo "rc=$?"; cat $OUT/host_copies.log
s host_timers
timeout 200 python3 benchmarks/host_timers.py --modes plain+overlap,dspark+overlap --rounds 3 --new-tokens 128 \
  --knob kestrel.engine.batch.REUSE_PINNED=True,False > $OUT/host_timers.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/host_timers.log | head -150
s done
