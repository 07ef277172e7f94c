#!/bin/bash
# 2026-12-07 20:27 session (issue 9), after call 183: the MLA split kernel's early latent reads (EARLY_KV) and the
# combine inside the W_uv head GEMV (COMBINE_IN_HEAD_GEMV_MAX_ROWS) are now defaults (the router in the settle and
# the latent store in the head GEMV lost and were removed). The floor, graph and timeline at batch 1 with the
# defaults; the MLA kernel and model tests; each default turn about against off at batch 1 and 2. About 4 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "floor, graph and timeline, defaults"
timeout 140 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --timeline-batches 1 \
  --timeline-top 14 --out $OUT > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -vE "^\s*$|UserWarning|_warn_once" $OUT/timeline.log | tail -22
s "MLA kernel and model tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "mla or head_gemv or store_latent or early_kv or pdl_graph or graph_decode" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -8
s "decode_knobs: each default turn about against off, batches 1 and 2"
timeout 200 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,2 --rounds 6 \
  --knob kestrel.ops.mla.triton.EARLY_KV=False,True --knob kestrel.ops.mla.COMBINE_IN_HEAD_GEMV_MAX_ROWS=0,2 \
  > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs.log
s done
