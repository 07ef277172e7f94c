#!/bin/bash
# Session of 2026-12-03, 07:05, call 5: the decode graph's argmax as one Triton program per row
# (ops/reduce_triton.py; torch's took 11.2 us in call 4). Its kernel test and the engine's GPU tests; the engine's
# batch-1 decode on k3-mini, traced.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 170 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_kernels.py -k "argmax or engine or graph or speculative or pending" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
s engine
timeout -k 5 150 python3 benchmarks/overlap.py --model k3-mini --rounds 3 --timeline > $OUT/overlap.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/overlap.log | head -24
s done
