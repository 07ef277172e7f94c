#!/bin/bash
# Session of 2026-12-02, 18:02, call 4: GEMV_MAX_M = 2 (a large weight's two-row products in the Triton GEMV).
# The linear kernel tests and the GPU engine and model tests; the batch sweep 1-4 with a timeline at batch 2;
# the GEMV-rows comparison again at batch 2 and 3.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernel-tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py -k "linear or gemv" > $OUT/kernels.log 2>&1
echo "rc=$?"; tail -2 $OUT/kernels.log; grep -E "^FAILED|Error" $OUT/kernels.log | head -5
s engine-tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/engine.log 2>&1
echo "rc=$?"; tail -2 $OUT/engine.log; grep -E "^FAILED" $OUT/engine.log | head -5
s sweep
timeout -k 5 300 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1,2,3,4 \
  --timeline-batches 2 --timeline-top 16 --out $OUT > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -E "^batch|timeline|^ +[0-9.]+ us|Error|error" $OUT/sweep.log | cut -c1-130
s rows
timeout -k 5 200 python3 benchmarks/gemv_rows.py --batches 2,3 --rows 1,2,4 2>&1 | grep -v Warning | tail -7
s done
