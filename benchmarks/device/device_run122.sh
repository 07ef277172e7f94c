#!/bin/bash
# Session of 2026-12-03, 18:42, call 3: the speculative step's first ops as kernels (each request's last token and
# prefix: ops.dspark.resolve; the VERIFY batch's positions, cache locations, keys and counts: block_positions), on
# top of call 2's. The whole GPU suite; the greedy step's graph alone (device time a step), lookup off and on; the
# speculative benchmark as served, lookup on, then off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s suite
timeout 330 python3 -m pytest -q -n 8 tests/gpu > $OUT/suite.log 2>&1
echo "rc=$?"; tail -2 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -20
for lk in off on; do
  s graph-$lk
  timeout 100 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes plain,dspark --prompts 2 \
    --new-tokens 32 --context-lookup $lk > $OUT/host_profile_$lk.log 2>&1
  echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|kernels of decode steps.*" $OUT/host_profile_$lk.log
done
s spec-on
timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  --context-lookup on > $OUT/spec_on.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_on.log
s spec-off
timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  --context-lookup off > $OUT/spec_off.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_off.log
s done
