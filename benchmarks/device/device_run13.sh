#!/bin/bash
# (PDL became the default after this ran: the flags here are the current spelling of what ran then)
# Call 3: the GPU tests call 2 lost to out-of-memory (8 xdist workers, each engine test takes 0.85 of free memory):
# kernel tests in 8 workers, PDL off and on; engine + model tests serially with PDL on. Then the batch-1 A/B with
# PDL (2 runs x 2 rounds per side) and the throughput sweep to batch 256.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
for p in --disable-pdl ""; do
  s "kernels $p"; timeout -k 5 75 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py $p > $OUT/t_k$p.log 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k$p.log | head -12
done
s "engine+model (PDL on)"; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_em.log | head -12
for i in 1 2; do s "ab $i"; timeout 70 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 --out $OUT/b1_$i.json > $OUT/b1_$i.log 2>&1; grep -E "plain .*tok/s" $OUT/b1_$i.log; done
s sweep; timeout 130 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 1,16,64,256 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "^   batch" $OUT/sweep.log
s done
