#!/bin/bash
# Session of 2026-12-04, 12:31, call 1: resident features in the greedy step graph (the graph writes the next
# features and windows into its own input rows; a step serving the same requests as the one before stacks and
# clones nothing). The engine and DSpark GPU tests; a mutation check (the copy-back removed, the step-graph test
# must fail); where the served batch-1 step's time goes with RESIDENT_FEATURES on / off; the served benchmark.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 140 python3 -m pytest -q -n 8 tests/gpu/test_engine_gpu.py tests/gpu/test_lookup_gpu.py \
  tests/gpu/test_kernels.py -k "dspark or lookup or Engine or engine or speculative or graph or head" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s mutation
cp kestrel/engine/cuda_graph.py /tmp/cg.py
sed -i 's/^                self.features\[:b\].copy_(feats)$/                pass/' kestrel/engine/cuda_graph.py
grep -c "self.features\[:b\].copy_(feats)" kestrel/engine/cuda_graph.py
timeout 80 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py -k "step_graph_equals_host" > $OUT/mutation.log 2>&1
echo "rc=$? (must be 1)"; tail -1 $OUT/mutation.log
cp /tmp/cg.py kestrel/engine/cuda_graph.py
for res in True False; do
  s "overlap resident=$res"
  timeout 70 python3 -c "
import runpy, sys
import kestrel.spec.worker as w
w.RESIDENT_FEATURES = $res
sys.argv = ['host_profile.py', '--device', 'cuda', '--dtype', 'bfloat16', '--modes', 'plain+overlap,dspark+overlap',
            '--prompts', '4', '--new-tokens', '96', '--context-lookup', 'on', '--top', '40']
runpy.run_path('benchmarks/host_profile.py', run_name='__main__')" > $OUT/overlap_$res.log 2>&1
  echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|kernels of decode steps.*" $OUT/overlap_$res.log
done
s spec
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end|tok/s" $OUT/spec.log | head -20
s done
