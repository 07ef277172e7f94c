#!/bin/bash
# 2026-12-07 20:27 session (issue 9). Four changes to k3-mini's batch-1 decode chain, each behind a knob that is off
# until measured. Three launches out of it: the MoE router's logits inside the AttnRes settle (kestrel.ops.attn_res.
# ROUTER_IN_SETTLE_MAX_TOKENS, 24 launches a step), the MLA latent store inside the q_nope head GEMV
# (kestrel.ops.mla.LATENT_IN_HEAD_GEMV, 6 a step) and the MLA decode's combine inside the W_uv head GEMV
# (kestrel.ops.mla.COMBINE_IN_HEAD_GEMV, 6 a step); and the MLA split kernel's cached latents read before its PDL
# wait (kestrel.ops.mla.triton.EARLY_KV). Each turn about against off; then their tests; then the floor, graph and
# timeline with the faster settings. About 7-8 minutes on the H200 (either GPU will do for the A/Bs).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
best() {  # the faster value of knob $2 in log $1
  python3 -c "
import re
rows = [(float(t), v) for v, t in re.findall(r'^batch 1 $2=(\S+): ([\d.]+) ms', open('$1').read(), re.M)]
print(min(rows)[1] if rows else '$3')"
}
s "decode_knobs: the four knobs, each turn about against off, batches 1 and 8"
timeout 360 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS=0,8 --knob kestrel.ops.mla.LATENT_IN_HEAD_GEMV=False,True \
  --knob kestrel.ops.mla.COMBINE_IN_HEAD_GEMV=False,True --knob kestrel.ops.mla.triton.EARLY_KV=False,True \
  > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs.log
router=$(best $OUT/knobs.log ROUTER_IN_SETTLE_MAX_TOKENS 0)
latent=$(best $OUT/knobs.log LATENT_IN_HEAD_GEMV False)
combine=$(best $OUT/knobs.log COMBINE_IN_HEAD_GEMV False)
early=$(best $OUT/knobs.log EARLY_KV False)
s "kernel and model tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "attn_res_settle or router_in_the_settle or pdl_graph or head_gemv or store_latent or latent_store or mla_decode or early_kv" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -8
s "floor, graph and timeline, ROUTER_IN_SETTLE_MAX_TOKENS=$router LATENT_IN_HEAD_GEMV=$latent COMBINE=$combine EARLY_KV=$early"
timeout 140 python3 -c "
import runpy, sys
import kestrel.ops.attn_res as A, kestrel.ops.mla as M, kestrel.ops.mla.triton as MT
A.ROUTER_IN_SETTLE_MAX_TOKENS, M.LATENT_IN_HEAD_GEMV, M.COMBINE_IN_HEAD_GEMV = $router, $latent, $combine
MT.EARLY_KV = $early
sys.argv = ['decode_ladder.py', '--skip-hf', '--skip-ladder', '--batches', '1', '--timeline-batches', '1',
            '--timeline-top', '14', '--out', '$OUT']
runpy.run_path('benchmarks/decode_ladder.py', run_name='__main__')
" > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -vE "^\s*$" $OUT/timeline.log | tail -24
s done
