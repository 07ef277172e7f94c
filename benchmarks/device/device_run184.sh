#!/bin/bash
# 2026-12-07 20:27 session (issue 9): device_run183.sh cut down for a short device budget: the four knobs turn about
# at batch 1 only, then their tests. About 4 minutes on the H200.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "decode_knobs: the four knobs, each turn about against off, batch 1"
timeout 200 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 6 \
  --knob kestrel.ops.attn_res.ROUTER_IN_SETTLE_MAX_TOKENS=0,8 --knob kestrel.ops.mla.LATENT_IN_HEAD_GEMV=False,True \
  --knob kestrel.ops.mla.COMBINE_IN_HEAD_GEMV=False,True --knob kestrel.ops.mla.triton.EARLY_KV=False,True \
  > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs.log
s "kernel and model tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "attn_res_settle or router_in_the_settle or pdl_graph or head_gemv or store_latent or latent_store or mla_decode or early_kv" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -8
s done
