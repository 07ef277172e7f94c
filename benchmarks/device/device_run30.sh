#!/bin/bash
# Session of 2026-11-30, 20:42, call 2: kda_chunked with 2-warp diagonal and off-diagonal kernels as defaults and
# the w / u0 kernel's split and pipeline depth as knobs. Its GPU test; ours at H = 16 / 32 / 96 (fla: call 1,
# device_run29.sh) with a per-kernel sweep at H = 96; Nsight Compute on ours at H = 96.
# (Ran twice: the first attempt failed at import, host_time having been dropped from common.py; the second ran
# with the GPU test line replaced by "echo skipped", as below.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s test; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k chunked > $OUT/t_chunk.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|assert" $OUT/t_chunk.log | head -12
s "chunk H=16,32"; mkdir -p $OUT/a
timeout -k 5 80 python3 benchmarks/kernels.py --out $OUT/a --sections chunk --heads 16,32 --no-fla > $OUT/a/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|failed|Error" $OUT/a/kernels.log | head
s "chunk H=96 + sweep"; mkdir -p $OUT/b
timeout -k 5 200 python3 benchmarks/kernels.py --out $OUT/b --sections chunk --heads 96 --no-fla --chunk-sweep > $OUT/b/stdout.log 2>&1; echo "rc=$?"
grep -E "^kda_chunked|^  chunk|failed|Error" $OUT/b/kernels.log | cut -c1-300
s ncu
timeout -k 5 100 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_chunk.py --heads 96 --no-fla > $OUT/ncu.txt 2>&1; echo "rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|L1/TEX Cache|DRAM Throughput|Dynamic Shared" $OUT/ncu.txt | head -50
s done
