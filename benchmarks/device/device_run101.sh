#!/bin/bash
# Session of 2026-12-02, 18:02, call 9: whole-model decode throughput against batch size on the committed tree
# (GEMV up to four rows), each graph timed synced and back to back.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s sweep
timeout -k 5 400 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1,2,3,4,8,16,32,64,128,256 \
  --out $OUT > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -E "^\||floor|Error|error" $OUT/sweep.log
s done
