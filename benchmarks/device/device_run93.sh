#!/bin/bash
# Session of 2026-12-02, 18:02, call 1: where the small-batch decode steps go. The batch sweep's step at batch 2
# took 1.8x batch 1's (2.965 against 1.619 ms on 2026-12-01), for ~1.25x the bytes. Sweep only (the engine's
# default kernels), with a graph timeline (charged time by kernel) at batch 1, 2, 4 and 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s sweep
timeout -k 5 400 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1,2,4,8,16 \
  --timeline-batches 1,2,4,8 --timeline-top 22 --out $OUT > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -E "floor|^batch|timeline|^ +[0-9.]+ us|Error|error" $OUT/sweep.log | cut -c1-150
s done
