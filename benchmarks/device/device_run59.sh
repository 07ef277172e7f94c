#!/bin/bash
# Session of 2026-12-01, 02:47, call 5 (last): every kernel test on the committed tree, then the whole decode ladder
# with both references in the same run (the bandwidth floor and transformers' KimiLinear eager decode, fla-core
# carried in .whl) and the batch sweep.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 130 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout -k 5 330 python3 benchmarks/decode_ladder.py --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|^stage|HF |interleaved|verify step|Error|error" $OUT/ladder_stdout.log | tail -30
grep -E "^batch " $OUT/decode_ladder.log | head -12
s done
