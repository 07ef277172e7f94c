#!/bin/bash
# 2026-12-07 18:14 session (issue 9). The MoE router's logits formed inside the AttnRes settle before it
# (kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS; the router GEMV's launch leaves the decode chain): k3-mini's
# decode graph turn about at batch 1, then the floor, the graph and a timeline at batch 1 with the faster setting,
# then the settle and model tests. Ask for the H200; about 4 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "decode_knobs ROUTER_IN_SETTLE_MAX_TOKENS"
timeout 120 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 6 \
  --knob kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS=0,8 > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^batch|^\| [0-9]" $OUT/knobs.log | tail -8
best=$(python3 -c "
import re
rows = [(float(t), int(m)) for m, t in re.findall(r'^batch 1 ROUTER_IN_SETTLE_MAX_TOKENS=(\d+): ([\d.]+) ms', open('$OUT/knobs.log').read(), re.M)]
print(min(rows)[1] if rows else 0)")
s "floor, graph and timeline, ROUTER_IN_SETTLE_MAX_TOKENS=$best"
timeout 140 python3 -c "
import runpy, sys
import kestrel.ops.attn_res as A
A.ROUTER_IN_SETTLE_MAX_TOKENS = $best
sys.argv = ['decode_ladder.py', '--skip-hf', '--skip-ladder', '--batches', '1', '--timeline-batches', '1',
            '--timeline-top', '14', '--out', '$OUT']
runpy.run_path('benchmarks/decode_ladder.py', run_name='__main__')
" > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -vE "^\s*$" $OUT/timeline.log | tail -24
s "settle kernel and model tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "attn_res_settle or router_in_the_settle or pdl_graph" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -8
s done
