#!/bin/bash
# Session of 2026-12-01, 01:16, call 2: the expert kernels' tests (with the up / down tiles split across the wait),
# then the ladder with the tile sweep (up split 4 / 2, a register cap, down split / rows) and the verify step.
# (Call 1, benchmarks/device/device_run47.sh, timed an L2 prefetch from the settle and router kernels; that code was
# reverted: see docs/kernels.md, session of 2026-12-01.)
# (The up / down tile-split knobs this call swept were not kept; the tile sweep now times other shapes.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 120 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe or route" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout -k 5 300 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --tile-sweep --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |timeline \(|tile sweep|verify step|Error|error" $OUT/ladder_stdout.log | head -60
s done
