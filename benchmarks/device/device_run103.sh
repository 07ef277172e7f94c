#!/bin/bash
# Session of 2026-12-02, 21:54, call 1: the MoE's shared experts on a second stream (moe_ops.SHARED_STREAM).
# The model GPU tests (bit-equality with the shared experts in line, PDL graphs), the engine GPU tests; the
# decode graph with the knob off and on at batches 1-8, turn about, back to back (decode_knobs.py, new);
# gemv_rows.py on its new shared loop as a smoke run.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 300 python3 -m pytest -q -n 4 tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR|Error" $OUT/tests.log | head -12
s knobs
timeout -k 5 240 python3 benchmarks/decode_knobs.py --knob kestrel.ops.moe.SHARED_STREAM=False,True --batches 1,2,4,8 > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/knobs.log | tail -14
s rows
timeout -k 5 120 python3 benchmarks/gemv_rows.py --batches 2 --rows 1,2g --rounds 2 2>&1 | grep -v Warning | tail -5
s done
