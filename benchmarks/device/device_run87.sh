#!/bin/bash
# Session of 2026-12-01, 23:10, call 3: the whole GPU suite on the committed tree (kernels changed at 06:37-07:32
# since its last full run, 142 of 142 at 02:47; this session changed the engine's host path and start-up).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s gpu-tests; timeout -k 10 540 python3 -m pytest -q -n 8 tests/gpu > $OUT/gpu_tests.log 2>&1
echo "rc=$?"; grep -E "passed|failed|error|FAILED|ERROR" $OUT/gpu_tests.log | tail -15
s done
