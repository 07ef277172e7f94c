#!/bin/bash
# Session of 2026-12-01, 23:10, call 4: the whole GPU suite again, its engines with pools sized for the tests (call 3: one kernel test ran out
# of memory beside engines sized from the free memory; it passed alone).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s gpu-tests; timeout -k 10 540 python3 -m pytest -q -n 8 tests/gpu > $OUT/gpu_tests.log 2>&1
echo "rc=$?"; grep -E "passed|failed|error|FAILED|ERROR" $OUT/gpu_tests.log | tail -15
s done
