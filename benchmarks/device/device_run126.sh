#!/bin/bash
# Session of 2026-12-03, 21:04, call 2: the folded drafter head also in the drafting loop's logits on a GPU (the
# host-acceptance path rates every position: it drafted through the unfolded head, so the step-graph test's two
# paths drafted differently). The engine and DSpark kernel GPU tests; where the served batch-1 step's time goes
# (host_profile with the overlap scheduler, fold on / off); the served benchmark with a longer limit.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 150 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or head" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
for fold in True False; do
  s "overlap fold=$fold"
  timeout 90 python3 -c "
import runpy, sys
import kestrel.spec.drafter as d
d.FOLD_GPU_HEAD = $fold
sys.argv = ['host_profile.py', '--device', 'cuda', '--dtype', 'bfloat16', '--modes', 'plain+overlap,dspark+overlap',
            '--prompts', '4', '--new-tokens', '96', '--context-lookup', 'on', '--top', '40']
runpy.run_path('benchmarks/host_profile.py', run_name='__main__')" > $OUT/overlap_$fold.log 2>&1
  echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|kernels of decode steps.*" $OUT/overlap_$fold.log
done
s spec
timeout 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end|tok/s" $OUT/spec.log | head -20
s done
