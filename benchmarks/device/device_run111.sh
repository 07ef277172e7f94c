#!/bin/bash
# Session of 2026-12-03, 09:05, call 3: the KDA recurrence over a block's steps (verify, fold) unrolled with each
# step's inputs loaded a step ahead (kda/triton.py: RECUR_PREFETCH). KDA kernel, model and engine GPU tests; the
# verify + fold graphs with the prefetch off and on, turn about (decode_knobs.py --verify-block, new), on k3-mini
# and on the bundled k3-small's shapes; section 2 of the speculative benchmark (k3-small + drafter, as served).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 170 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py \
  -k "kda or fold or verify or spec or engine or model or graph" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
for preset in k3-mini k3-small; do
s "knob $preset"
timeout -k 5 90 python3 benchmarks/decode_knobs.py --knob kestrel.ops.kda.triton.RECUR_PREFETCH=False,True \
  --preset $preset --batches 1,8,64 --verify-block 8 --skip-decode --rounds 6 > $OUT/knob_$preset.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/knob_$preset.log | grep "^|" | tail -6
done
s spec
timeout 130 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log
s done
