#!/bin/bash
# Session of 2026-12-03, 09:05, call 4: the committed form of the recurrence prefetch (key heads up to 64 wide)
# and the KDA test running both forms; the KDA kernel and the engine GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py tests/gpu/test_engine_gpu.py -k "kda or fold or verify or spec or engine" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
# decode_knobs.py after its decode and verify comparisons came to share one loop (_turn_about)
timeout -k 5 120 python3 benchmarks/decode_knobs.py --knob kestrel.ops.kda.triton.RECUR_PREFETCH=False,True \
  --preset k3-small --batches 1 --verify-block 8 --rounds 4 > $OUT/knob.log 2>&1
echo "rc=$?"; grep "^|" $OUT/knob.log
