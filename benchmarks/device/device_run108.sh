#!/bin/bash
# Session of 2026-12-03, 07:05, call 6 (same lease as call 5): the engine's batch-1 decode with torch's argmax
# (reduce_triton.MAX_COLS = 0: the Triton kernel declines every row) against the Triton argmax, in the graph and
# in the sampler, two engines each, alternating.
export PYTHONPATH=.
for cols in 0 65536 0 65536; do timeout 80 python3 -c "
import sys, runpy
import kestrel.ops.reduce_triton as r
r.MAX_COLS = $cols
sys.argv = ['overlap.py', '--model', 'k3-mini', '--rounds', '2', '--prompts', '3']
runpy.run_path('benchmarks/overlap.py', run_name='__main__')" 2>&1 | grep -E "overlap|graph alone" | sed "s/^/cols=$cols /"; done
