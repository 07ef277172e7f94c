#!/bin/bash
# Session of 2026-11-30, 19:22, call 1: where kda_chunked's time goes against fla's chunk_kda (per-kernel GPU time
# for both, T = 8192 varlen, H = 16 / 32 / 96), each head count in its own process so one slow autotune leaves the rest.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
for H in 16 32 96; do
  s "chunk H=$H"; mkdir -p $OUT/h$H
  timeout -k 5 150 python3 benchmarks/kernels.py --out $OUT/h$H --sections chunk --heads $H > $OUT/h$H/stdout.log 2>&1; echo "rc=$?"
  grep -E "^kda_chunked|kernel time|^  " $OUT/h$H/kernels.log | head -40
done
s done
