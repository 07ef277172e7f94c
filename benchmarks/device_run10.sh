#!/bin/bash
# Prepared for the next device session (not run yet). In order of value:
# 1. the whole GPU suite with PDL off (the default), a per-test timeout so a stall names its test;
# 2. the batch-1 engine A/B the evening could not isolate (plain and DSpark decode, PDL off then on);
# 3. the throughput sweep to batch 256 (two engines for the whole sweep now, so it fits the time limit);
# 4. the model tests with PDL on for every test (pytest --enable-pdl), with tracebacks on a stall.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider --tb=line -o faulthandler_timeout=60 tests/gpu > $OUT/t_gpu.log 2>&1; echo "rc=$?"; grep -E "^(/|E )|Error|passed|failed|Timeout|File" $OUT/t_gpu.log | head -30
s ab; for p in "" --enable-pdl; do timeout 100 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 $p --out $OUT/spec_b1$p.json > $OUT/spec_b1$p.log 2>&1; echo "[$p] rc=$?"; grep -E "plain|step" $OUT/spec_b1$p.log | tail -2; done
s sweep; timeout 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 1,16,64,256 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -E "^   batch" $OUT/spec.log
s pdl; timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider --tb=short -o faulthandler_timeout=40 tests/gpu/test_model_gpu.py --enable-pdl > $OUT/t_pdl.log 2>&1; echo "rc=$?"; grep -E "passed|failed|Timeout|File \"/" $OUT/t_pdl.log | head -20
s done
