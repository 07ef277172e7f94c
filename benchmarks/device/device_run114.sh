#!/bin/bash
# Session of 2026-12-03, 12:11, call 2: every GPU test on the tree after the CPU chunked KDA's rewrite (the
# reference the GPU tests use as their oracle) and the packed conv's row blocks (CPU only; one block on CUDA).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 500 python3 -m pytest -q -n 4 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
