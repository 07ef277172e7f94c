#!/bin/bash
# Session of 2026-12-03, 18:42, call 5 (the session's last device minutes): three more of the greedy step's torch ops
# into kernels it already runs or one launch (the acceptance publishes the next token and commit for a chained step;
# block_positions also builds the blocks' token ids; the next features gathered from the captured layers in one
# launch). The kernel and engine GPU tests; the step graph alone (lookup on); the served benchmark (lookup on).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 120 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py tests/gpu/test_model_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or model or kda" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s graph
timeout 50 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark --prompts 2 \
  --new-tokens 32 --context-lookup on > $OUT/host_profile.log 2>&1
echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|kernels of decode steps.*" $OUT/host_profile.log
s spec
timeout 90 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log
s done
