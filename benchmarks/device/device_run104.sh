#!/bin/bash
# Session of 2026-12-02, 21:54, call 2: the shared experts' second stream from two tokens (SHARED_STREAM_MIN_TOKENS).
# The new test and the paired-tail test; the knob off and on at batches 2-256 and on two eager prefills.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR|Error" $OUT/tests.log | head -12
s knobs
timeout -k 5 330 python3 benchmarks/decode_knobs.py --knob kestrel.ops.moe.SHARED_STREAM=False,True --batches 1,2,3,16,32,64,128,256 --prefill-lens 512,4096 > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/knobs.log | tail -24
s done
