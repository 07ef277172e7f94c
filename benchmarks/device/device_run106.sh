#!/bin/bash
# Session of 2026-12-03, 07:05, call 3: the committed tree (MoE shared experts on a second stream for 4-128 tokens)
# plus the decode graph's own argmax (a plain greedy step's tokens and future write inside the graph). All GPU
# tests; the batch sweep; the engine's batch-1 decode: serial, overlapped, overlapped with the argmax after the
# graph, and traced against its graph alone (overlap.py --timeline, new).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 330 python3 -m pytest -q -n 4 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
s sweep
timeout -k 5 200 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1,2,3,4,8,16,32,64,128,256 --out $OUT > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/sweep.log | tail -16
s engine
timeout -k 5 200 python3 benchmarks/overlap.py --model k3-mini --rounds 3 --timeline > $OUT/overlap.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/overlap.log | head -60
s done
