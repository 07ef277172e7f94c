#!/bin/bash
# Session of 2026-12-04, 12:31, call 4: the resident rows held with the requests (a settle no longer reads the
# step graph runner, which may be gone); the engine GPU tests again; which torch ops a step still launches.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 150 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or head or fold" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s step_ops
timeout 80 python3 benchmarks/step_ops.py > $OUT/step_ops.log 2>&1
echo "rc=$?"; grep -v "loading weights" $OUT/step_ops.log | head -70 | cut -c1-150
s done
