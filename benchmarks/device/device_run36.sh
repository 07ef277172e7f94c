#!/bin/bash
# Session of 2026-11-30, 22:06, call 2: launch() fixed (Triton 3.6's empty launch-hook chain no longer reads as a
# hook), the recurrence's programs started longest sequence first. All kernel tests; ours alone at H = 16 / 32 /
# 96 with the recurrence sweep and the host variants.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_k.log | head -12
s sweep; timeout -k 5 200 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 16,32,96 --no-fla --chunk-sweep > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|host variants|^  chunk|failed|Error" $OUT/kernels.log | cut -c1-260
s done
