#!/bin/bash
# Session of 2026-12-01, 01:16, call 3: the GEMV kernel tests (with PERSIST: fewer programs than tiles), then the
# ladder with the tile sweep over programs an SM for the multi-wave GEMVs, and the batch sweep.
# (The persistent-GEMV knob this call swept was not kept; the tile sweep now times other shapes.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 120 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout -k 5 420 python3 benchmarks/decode_ladder.py --skip-hf --tile-sweep --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |timeline \(|tile sweep|verify step|Error|error" $OUT/ladder_stdout.log | head -70
s done
