#!/bin/bash
# Session of 2026-11-30, 20:42, call 1: kda_chunked with the intra kernel split (diagonal blocks in their own
# launch, off-diagonal blocks with block-local gate sums) and w / u0 as one program per (chunk, head) reading the
# inverse once. Its GPU test; against fla at H = 16 / 32 / 96 in the same run; a launch-shape sweep at H = 96;
# then Nsight Compute on ours and fla's at H = 96.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s "chunk H=16,32"; mkdir -p $OUT/a
timeout -k 5 120 python3 benchmarks/kernels.py --out $OUT/a --sections chunk --heads 16,32 > $OUT/a/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla safe|kernel time per call|failed|Error" $OUT/a/kernels.log | head -30
s "chunk H=96 + sweep"; mkdir -p $OUT/b
timeout -k 5 140 python3 benchmarks/kernels.py --out $OUT/b --sections chunk --heads 96 --chunk-sweep > $OUT/b/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^fla safe|kernel time per call|^  chunk|failed|Error" $OUT/b/kernels.log | head -30
s ncu
timeout -k 5 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_chunk.py --heads 96 > $OUT/ncu.txt 2>&1; echo "rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu.txt | head -80
s done
