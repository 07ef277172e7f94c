#!/bin/bash
# Session of 2026-11-30, 22:06, call 3: kda_chunked (launch(), cached chunk tables, longest-first recurrence)
# against fla's chunk_kda at H = 16 / 32 / 96 in one run, with the host variants; host / GPU timelines last.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "chunk vs fla"; timeout -k 5 520 python3 benchmarks/kernels.py --out $OUT --sections chunk --heads 16,32,96 > $OUT/k_stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla safe|kernel time per call|host variants|failed|Error" $OUT/kernels.log | cut -c1-250
s done
