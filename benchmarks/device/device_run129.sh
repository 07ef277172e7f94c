#!/bin/bash
# Session of 2026-12-04, 12:31, call 3: the drafter block's front in one kernel (dspark.block_front), the drafted
# positions' keys decoded in one launch (dspark.decode_keys), the fold's integers converted once a step instead of
# once a layer. The kernel and engine GPU tests; the step graph's time and kernel order (host_profile --timeline);
# which torch ops a step still launches (step_ops.py); the served benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 150 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or head or fold or kda" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s timeline
timeout 100 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark+overlap,plain+overlap \
  --prompts 4 --new-tokens 96 --context-lookup on --top 5 --timeline > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|timeline \(.*" $OUT/timeline.log
grep -a -A24 "charged time by kernel" $OUT/timeline.log | head -26
s step_ops
timeout 80 python3 benchmarks/step_ops.py > $OUT/step_ops.log 2>&1
echo "rc=$?"; head -60 $OUT/step_ops.log | cut -c1-150
s spec
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log | head -20
s done
