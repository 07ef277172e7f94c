#!/bin/bash
# Session of 2026-12-03, 14:02, call 3: every GPU test on the session's final tree (after call 1 only CPU paths
# changed: the K-major CPU weight layout, the engine-owned-model flag the runner reads on every device).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 420 python3 -m pytest -q -n 4 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
