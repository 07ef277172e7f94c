#!/bin/bash
# Session of 2026-12-04, 17:53, call 4: the batch-1 served ratio at 128 new tokens over 24 prompts a set, with the
# fold of every KDA layer in one launch.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "spec 128 x 24"
timeout 220 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s "step graph"
timeout 100 python3 benchmarks/step_knobs.py --knob kestrel.ops.kda.triton.FOLD_LAYERS_ONE_LAUNCH=True,False \
  > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -4 $OUT/step_knobs.log
s done
