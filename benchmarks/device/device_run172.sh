#!/bin/bash
# Ran once, on a working tree whose knobs (k3.BANK_BUFFER, attn_res.triton.ONE_LAYOUT, settle_chain.py --layouts and
# its "one bank buffer" chains) were removed before committing: kept as the record of what docs/kernels.md cites.
# 2026-12-07 14:30 session, second call (issue 9): the settle with every vector in the tile's layout
# (attn_res.triton.ONE_LAYOUT; no layout conversions, offline sm_90 TTGIR) against the 1-D form, on the chain
# (settle_chain.py) and in k3-mini's batch-1 and batch-8 decode graphs; the one-buffer bank (k3.BANK_BUFFER) again
# on top; the settle, norm and model GPU tests. About 3 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "settle chain"
timeout 100 python3 benchmarks/settle_chain.py --dim 2048 --links 48 --banks 1,2,6 2>&1 | grep -v Warning \
  | tee $OUT/settle.log | grep -E "^\| gemv|floor|Error|error"
s "tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "attn_res or norms or model_gpu" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head
for knob in kestrel.ops.attn_res.triton.ONE_LAYOUT=False,True kestrel.models.k3.BANK_BUFFER=False,True; do
  s "decode_knobs k3-mini $knob"
  timeout 100 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 --knob $knob \
    > $OUT/knobs_${knob%%=*}.log 2>&1
  echo "rc=$?"; grep -E "^\| [0-9]" $OUT/knobs_${knob%%=*}.log | tail -4
done
s done
