#!/bin/bash
# Session of 2026-12-04, 14:51, call 3: the fold's conv tails as extra programs of the recurrence's launch
# (kda FOLD_TAIL_IN_RECUR) and the first confidence inside the tokens' decode launch. All GPU tests; the step graph
# under the tail knob and the MoE's in-kernel routing for 8 tokens (step_knobs.py); the timeline; the served case.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 300 python3 -m pytest -q -n 8 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s step_knobs
timeout 150 python3 benchmarks/step_knobs.py --knob kestrel.ops.kda.triton.FOLD_TAIL_IN_RECUR=True,False \
  --knob kestrel.ops.moe.triton.ROUTE_IN_KERNEL_MAX_TOKENS=1,8 > $OUT/step_knobs.log 2>&1
echo "rc=$?"; tail -6 $OUT/step_knobs.log
s timeline
timeout 110 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark+overlap,plain+overlap \
  --prompts 4 --new-tokens 96 --context-lookup on --top 5 --timeline > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|timeline \(.*" $OUT/timeline.log
grep -a -A24 "charged time by kernel" $OUT/timeline.log | head -26
s spec
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log | head -20
s done
