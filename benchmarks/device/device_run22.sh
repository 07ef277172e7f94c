#!/bin/bash
# Call 6 of the 17:25 session: the ladder with the KDA decode kernels reading before their wait (after a
# late-trigger gate projection), each stage's race check, and the tile sweep with the settle's warps; the KDA
# kernel tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 90 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "kda or settle or linear or moe" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s ladder; timeout 300 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf --tile-sweep > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^interleaved|verify step|Error" $OUT/ladder_stdout.log | head -40
grep -A14 "^timeline" $OUT/ladder_stdout.log | head -32
s done
