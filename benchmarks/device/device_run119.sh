#!/bin/bash
# Session of 2026-12-03, 16:21, call 2: context lookup on the GPU's fast path. The lookup step as one Triton kernel
# (kestrel/ops/lookup_triton.py) and the first position's confidence inside the fast greedy drafting; the kernel
# test, the engine GPU tests (step graph with lookup on == host acceptance), the drafter kernel tests; then the
# speculative benchmark on the H200 as served (bf16, bundled k3-small + drafter), lookup on, then off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 300 python3 -m pytest -q -n 4 tests/gpu/test_lookup_gpu.py tests/gpu/test_engine_gpu.py \
  "tests/gpu/test_kernels.py" -k "lookup or Engine or engine or speculative or graph or dspark or draft or correct or head_keys or accept" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s spec-on
timeout 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 1,2 --prompts 12 --stop-at-eos \
  --context-lookup on > $OUT/spec_on.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_on.log
s spec-off
timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  --context-lookup off > $OUT/spec_off.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_off.log
s done
