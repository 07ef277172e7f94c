#!/bin/bash
# Session of 2026-12-01, 23:10, call 5: the decode ladder on the committed tree (no kernel changed this session; its
# last full run was 02:47, and the GEMV's small-weight rows came after it), for issue 9's current figure.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s ladder; timeout -k 5 400 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|bit-equal|interleaved|^stage|Error|error" $OUT/ladder_stdout.log | tail -30
s done
