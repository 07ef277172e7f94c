#!/bin/bash
# Session of 2026-12-02, 18:02, call 5: the GEMV-rows comparison with programmatic dependent launch on (as the
# engine runs; call 3's and 4's comparisons ran with it off), batch 2-8, GEMV_MAX_M 1 / 2 / 4 / 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s rows
timeout -k 5 400 python3 benchmarks/gemv_rows.py --batches 2,3,4,8 --rows 1,2,4,8 2>&1 | grep -v Warning | tail -14
s done
