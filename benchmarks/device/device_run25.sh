#!/bin/bash
# Session of 2026-11-30, 19:22, call 2: kda_chunked rebuilt (intra per 16-row block, substitution per column
# block, pipelined recurrence): its GPU test, then against fla's chunk_kda at H = 16 / 32 / 96 with a sweep of its
# launch shapes, each head count in its own process.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
for H in 16 32 96; do
  s "chunk H=$H"; mkdir -p $OUT/h$H
  timeout -k 5 160 python3 benchmarks/kernels.py --out $OUT/h$H --sections chunk --heads $H --chunk-sweep > $OUT/h$H/stdout.log 2>&1; echo "rc=$?"
  grep -E "^kda_chunked|kernel time|^  |failed|Error" $OUT/h$H/kernels.log | grep -v "fla chunk_kda safe_gate=False" | head -40
done
s done
