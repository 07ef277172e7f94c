#!/bin/bash
# Session of 2026-12-01, 01:16, call 4: the batch sweep with programmatic dependent launch on (as the engine
# captures its graphs; earlier sweeps ran with plain launches), after the ladder; which profilers the image has.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tools; which ncu nsys nvidia-smi 2>&1 | head; ls /usr/local/cuda*/bin 2>/dev/null | grep -iE "ncu|nsys|nsight" | head
s ladder; timeout -k 5 420 python3 benchmarks/decode_ladder.py --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |verify step|Error|error" $OUT/ladder_stdout.log | head -60
s done
