#!/bin/bash
# Session of 2026-12-04, 14:51, call 6: the norm kernels' shared math as one jit helper (_normed; the review's
# duplicate). The kernel, model and engine GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py \
  tests/gpu/test_drafter_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
