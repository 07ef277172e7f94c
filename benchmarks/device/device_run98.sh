#!/bin/bash
# Session of 2026-12-02, 18:02, call 6: the decode ladder with the last stage also timed back to back (the
# engine's steady state), and the engine's own batch-1 decode on k3-mini (overlap against serial).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s ladder
timeout -k 5 330 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|bit-equal|back to back|interleaved|^stage|Error|error" $OUT/ladder_stdout.log | tail -22
s overlap
timeout -k 5 220 python3 benchmarks/overlap.py --model k3-mini --rounds 3 2>&1 | grep -v Warning | tail -8
s done
