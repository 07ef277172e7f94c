#!/bin/bash
# Session of 2026-11-30, 19:22, call 4: kda_chunked with u0 in the activations' dtype; its GPU test; against fla's
# chunk_kda at H = 16 / 32 / 96 in the same run, with host issue times, a kernel-time sweep of launch shapes (tf32
# inverse among them; each checked against the defaults' output) and a host profile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
for H in 16 32 96; do
  s "chunk H=$H"; mkdir -p $OUT/h$H
  timeout -k 5 140 python3 benchmarks/kernels.py --out $OUT/h$H --sections chunk --heads $H --chunk-sweep > $OUT/h$H/stdout.log 2>&1; echo "rc=$?"
  grep -E "^kda_chunked|^fla safe|kernel time per call|^  chunk|failed|Error" $OUT/h$H/kernels.log | head -30
done
grep -E "host \|" $OUT/h16/kernels.log | head -16
s done
