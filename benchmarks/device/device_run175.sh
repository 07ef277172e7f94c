#!/bin/bash
# 2026-12-07 16:37 session (issue 9). Call 174 found the prep kernel's channel-column form (CHANNELS_FIRST) 1.067x
# faster at batch 1 (k3-mini, H100) but not bit-equal where it must be: the compiler contracted its conv's bf16
# product and sum into fma.rn.bf16 (dropping the product's rounding), differently in decode and verify. The prep
# kernel now compiles with enable_fp_fusion=False (offline sm_90: no fma left in either form). Rerun the KDA kernel
# tests with both forms and the timings.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "KDA kernel tests, both prep forms"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py -k "kda" > $OUT/kda_tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/kda_tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/kda_tests.log | head -12
s "decode_knobs k3-mini CHANNELS_FIRST"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob kestrel.ops.kda.triton_conv.CHANNELS_FIRST=False,True > $OUT/knobs_mini.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_mini.log | tail -4
s "decode_knobs k3-small verify + fold CHANNELS_FIRST"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-small --batches 1,8,64 --verify-block 8 --skip-decode \
  --knob kestrel.ops.kda.triton_conv.CHANNELS_FIRST=False,True > $OUT/knobs_small.log 2>&1
echo "rc=$?"; grep -E "^\| verify" $OUT/knobs_small.log | tail -6
s done
