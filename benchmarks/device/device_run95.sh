#!/bin/bash
# Session of 2026-12-02, 18:02, call 3: small-batch decode with the large weights' products in the Triton GEMV
# (GEMV_MAX_M 2 / 4 / 8) against cuBLAS (1), interleaved, back to back; then the linear kernel tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s rows
timeout -k 5 400 python3 benchmarks/gemv_rows.py --batches 2,4,8 --rows 1,2,4,8 2>&1 | grep -v Warning | tail -16
s done
