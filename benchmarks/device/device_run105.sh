#!/bin/bash
# Session of 2026-12-03, 07:05, call 2: the AttnRes settle's bank folded into an online softmax before its wait
# (attn_res/triton.py: ONLINE), and the MoE's second stream now for 4-128 tokens. Kernel and model tests; the
# ONLINE knob off and on at batches 1, 2, 8, 64 and one eager prefill; the settle's warps at batch 1; the MoE's
# second stream off and on at 4, 8, 128, 256 and one prefill (on only for 4-128 tokens now).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 240 python3 -m pytest -q -n 4 tests/gpu/test_model_gpu.py tests/gpu/test_kernels.py -k "attn_res or model or moe or shared" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR|Error" $OUT/tests.log | head -12
s knobs
timeout -k 5 240 python3 benchmarks/decode_knobs.py --knob kestrel.ops.attn_res.triton.ONLINE=False,True --batches 1,2,8,64 --prefill-lens 512 > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/knobs.log | tail -12
s warps
timeout -k 5 150 python3 benchmarks/decode_knobs.py --knob kestrel.ops.attn_res.triton.WARPS=None,4,16 --batches 1 --rounds 8 > $OUT/warps.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/warps.log | tail -5
s stream
timeout -k 5 200 python3 benchmarks/decode_knobs.py --knob kestrel.ops.moe.SHARED_STREAM=False,True --batches 4,8,128,256 --prefill-lens 512 > $OUT/stream.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/stream.log | tail -12
s done
