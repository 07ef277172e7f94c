#!/bin/bash
# Session of 2026-12-02, 18:02, call 10: the expert GEMVs routing every token themselves at batch 2-8
# (ROUTE_IN_KERNEL_MAX_TOKENS 8) against routing as its own launch above one token (1, the default), on top of the
# GEMV up to four rows; also the cuBLAS baseline.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s rows
timeout -k 5 400 python3 benchmarks/gemv_rows.py --batches 2,3,4,8 --rows 1,1r,4g,4gr 2>&1 | grep -v Warning | tail -14
s done
