#!/bin/bash
# Prepared by the 2026-12-07 14:30 session (issue 9; not run then: the session's device time was spent). The KDA
# prep kernel with per-tap channel columns (kda.triton_conv.CHANNELS_FIRST: offline sm_90, 0 layout conversions and
# 6 barriers after the PDL wait against 6 and 48) against the window form: the KDA kernel tests with both, k3-mini's
# decode graph at batch 1 and 8 and k3-small's verify + fold, turn about; then the default batch-1 decode graph
# against the card's floor and the GPU suite on this tree. About 6 minutes. If CHANNELS_FIRST wins, make it the
# default (and, as with the settle, remove the window form); if not, remove it.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "KDA kernel tests, both prep forms"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py -k "kda" > $OUT/kda_tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/kda_tests.log; grep -E "^FAILED|^ERROR" $OUT/kda_tests.log | head
s "decode_knobs k3-mini CHANNELS_FIRST"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob kestrel.ops.kda.triton_conv.CHANNELS_FIRST=False,True > $OUT/knobs_mini.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_mini.log | tail -4
s "decode_knobs k3-small verify + fold CHANNELS_FIRST"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-small --batches 1,8,64 --verify-block 8 --skip-decode \
  --knob kestrel.ops.kda.triton_conv.CHANNELS_FIRST=False,True > $OUT/knobs_small.log 2>&1
echo "rc=$?"; grep -E "^\|" $OUT/knobs_small.log | tail -8
s "batch-1 decode graph, default kernels"
timeout 80 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|back to back" $OUT/ladder.log | head -4
s "GPU suite"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -1 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
s done
