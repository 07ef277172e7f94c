#!/bin/bash
# Session of 2026-11-30, 20:42, call 4: kda_chunked with the gated rows made by gate programs in the diagonal
# kernel's launch (16 columns each) and (I + A)^-1 stored in bf16 for bf16 inputs. Its GPU test; a short sweep at
# H = 96 (ours only); against fla at H = 16 / 32 / 96 in the same run, host / GPU timelines last.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s "sweep H=96"; mkdir -p $OUT/b
timeout -k 5 60 python3 benchmarks/kernels.py --out $OUT/b --sections chunk --heads 96 --no-fla --chunk-sweep > $OUT/b/stdout.log 2>&1; echo "rc=$?"
grep -E "^  chunk|failed|Error" $OUT/b/kernels.log | cut -c1-300
s "chunk vs fla"; mkdir -p $OUT/a
timeout -k 5 400 python3 benchmarks/kernels.py --out $OUT/a --sections chunk --heads 16,32,96 > $OUT/a/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla safe|kernel time per call|failed|Error" $OUT/a/kernels.log | cut -c1-250
s done
