#!/bin/bash
# Session of 2026-11-30, 20:42, call 3: kda_chunked with one-warp diagonal / off-diagonal kernels (16-column
# pieces), the gated rows (q exp(gc), k exp(gc_last - gc), beta k exp(gc)) written by the off-diagonal kernel, and
# w / u0 reading beta k exp(gc) instead of k and the gates. Its GPU test; against fla at H = 16 / 32 / 96 in the
# same run with host / GPU timelines; a per-kernel sweep at H = 96 (ours only).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s "chunk vs fla"; mkdir -p $OUT/a
timeout -k 5 220 python3 benchmarks/kernels.py --out $OUT/a --sections chunk --heads 16,32,96 > $OUT/a/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla safe|kernel time per call|failed|Error" $OUT/a/kernels.log | cut -c1-250
s "sweep H=96"; mkdir -p $OUT/b
timeout -k 5 150 python3 benchmarks/kernels.py --out $OUT/b --sections chunk --heads 96 --no-fla --chunk-sweep > $OUT/b/stdout.log 2>&1; echo "rc=$?"
grep -E "^  chunk|failed|Error" $OUT/b/kernels.log | cut -c1-300
s done
