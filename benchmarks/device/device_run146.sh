#!/bin/bash
# Session of 2026-12-04, 17:53, call 3: ReplaySSM's fold of every KDA layer in one launch (kda.triton.
# FOLD_LAYERS_ONE_LAUNCH; each layer's fold launch used to wait for the one before it): the speculative step graph
# and k3-small's verify + fold graphs with it on and off; all GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s step_knobs
timeout 120 python3 benchmarks/step_knobs.py --knob kestrel.ops.kda.triton.FOLD_LAYERS_ONE_LAUNCH=True,False \
  > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -4 $OUT/step_knobs.log
s "decode_knobs k3-small verify + fold"
timeout 100 python3 benchmarks/decode_knobs.py --preset k3-small --batches 1,8,64 --verify-block 8 --skip-decode \
  --knob kestrel.ops.kda.triton.FOLD_LAYERS_ONE_LAUNCH=True,False > $OUT/decode_small.log 2>&1
echo "rc=$?"; grep "^|" $OUT/decode_small.log | tail -7
s tests
timeout 300 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s done
