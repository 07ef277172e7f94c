#!/bin/bash
# Ran once, on a working tree whose knobs (k3.BANK_BUFFER, attn_res.triton.ONE_LAYOUT, settle_chain.py --layouts and
# its "one bank buffer" chains) were removed before committing: kept as the record of what docs/kernels.md cites.
# 2026-12-07 14:30 session (issue 9): the settle with its bank as one tile. settle_chain.py with 1, 2 and 6 bank
# values, the bank value by value and as views of one buffer; the settle and model GPU tests of the one-buffer bank;
# k3-mini's batch-1 decode graph with k3.BANK_BUFFER off and on, turn about. About 4 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "settle chain"
timeout 100 python3 benchmarks/settle_chain.py --dim 2048 --links 48 --banks 1,2,6 2>&1 | grep -v Warning \
  | tee $OUT/settle.log | grep -E "^\||floor|Error|error"
s "tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  -k "attn_res or norms or bank_buffer or pdl_graph" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head
s "decode_knobs k3-mini BANK_BUFFER"
timeout 150 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob kestrel.models.k3.BANK_BUFFER=False,True > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\||bit|rel" $OUT/knobs.log | tail -10
s done
