#!/bin/bash
# Session of 2026-12-03, 21:04, call 1: GPU greedy drafting with the output norm and projection folded into the
# vocabulary kernel (three kernels a drafted position instead of four; kestrel.spec.drafter.FOLD_GPU_HEAD). The
# kernel, lookup and engine GPU tests; the step graph alone with the fold off / on / off / on (lookup on); the served
# benchmark (fold on, the default).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 150 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py tests/gpu/test_model_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or model or head" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
for fold in False True False True; do
  s "graph fold=$fold"
  timeout 60 python3 -c "
import runpy, sys
import kestrel.spec.drafter as d
d.FOLD_GPU_HEAD = $fold
sys.argv = ['host_profile.py', '--device', 'cuda', '--dtype', 'bfloat16', '--modes', 'dspark', '--prompts', '2',
            '--new-tokens', '32', '--context-lookup', 'on']
runpy.run_path('benchmarks/host_profile.py', run_name='__main__')" > $OUT/host_profile_$fold.log 2>&1
  echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|kernels of decode steps.*|tokens a step.*" $OUT/host_profile_$fold.log
done
s spec
timeout 120 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log
s done
