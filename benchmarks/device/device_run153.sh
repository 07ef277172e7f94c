#!/bin/bash
# Prepared 2026-12-05 (no device lent that session): the GPU suite on the tree with launches of several decode steps
# (test_engine_on_gpu_matches_the_reference_path now runs them: steps=4), the prefill-drain fix and the batch cap of
# auto verify launches (CPU-tested only so far); then batch-1 decode on k3-mini with 1 and 4 decode steps a launch.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 260 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | cut -c1-600 | head -20
s "overlap k3-mini"
timeout 200 python3 benchmarks/overlap.py --model k3-mini --device cuda --dtype bfloat16 --rounds 3 \
  --decode-steps 4 > $OUT/overlap.log 2>&1
echo "rc=$?"; grep -v "^loading" $OUT/overlap.log | tail -8
s done
