#!/bin/bash
# Session of 2026-12-01, 19:20, call 1: the sampler change (fixed flags once, one pass over non-plain rows) under
# the GPU engine tests, then run 79's decode-only kernel tables and speculative section 2 with its end-to-end split.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_e.log | head -20
bash benchmarks/device/device_run79.sh
