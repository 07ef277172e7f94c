#!/bin/bash
# Session of 2026-12-02, 18:02, call 8: the committed defaults (GEMV_MAX_M 4, ROW_GRID_LARGE_MAX_M 4). The whole
# GPU suite; the batch sweep 1-8 (synced, as the ladder times it); gemv_rows against cuBLAS at batch 2-4.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s gpu-suite
timeout 330 python3 -m pytest -q -n 8 tests/gpu > $OUT/gpu.log 2>&1
echo "rc=$?"; tail -2 $OUT/gpu.log; grep -E "^FAILED|^ERROR" $OUT/gpu.log | head -8
s sweep
timeout -k 5 200 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1,2,3,4,8 --out $OUT > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -E "^batch|Error|error" $OUT/sweep.log
s rows
timeout -k 5 200 python3 benchmarks/gemv_rows.py --batches 2,3,4 --rows 1,4g 2>&1 | grep -v Warning | tail -8
s done
