#!/bin/bash
# Session of 2026-12-02, 18:02, call 7: a large weight's rows in programs of their own (ROW_GRID 2: the rows on
# grid axis 0, so the rows of one tile share its L2 fill), against one program per tile reducing every row and
# against cuBLAS, batch 2-8. The linear kernel tests first.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernel-tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py -k "linear or gemv" > $OUT/kernels.log 2>&1
echo "rc=$?"; tail -2 $OUT/kernels.log; grep -E "^FAILED|Error" $OUT/kernels.log | head -5
s rows
timeout -k 5 400 python3 benchmarks/gemv_rows.py --batches 2,3,4,8 --rows 1,2,2g,4,4g,8g 2>&1 | grep -v Warning | tail -22
s done
