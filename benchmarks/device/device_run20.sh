#!/bin/bash
# Call 4 of the 17:25 session: the decode ladder with the early settle stage, its interleaved comparison and the
# GEMV tile sweep inside the final graph.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s ladder; timeout 420 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf --tile-sweep > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^interleaved|^timeline|^tile|verify step|Error" $OUT/ladder_stdout.log | head -40
s done
