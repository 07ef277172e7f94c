#!/bin/bash
# Evening call 2: DSpark on the H200 with the H200-distilled drafter, fused settle / residual epilogue and PDL
# (batch 1 with its phases, throughput to batch 256), first, on a quiet machine; then the whole GPU suite (its
# engine tests start server processes: a suite killed at its limit must not leave them beside a benchmark).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec; timeout 250 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2,3 --batches 1,64,256 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -v Warn $OUT/spec.log | tr '\r' '\n' | grep -E "^ +[a-z]|^[0-9]" | tail -12
s tests; timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider --tb=line --durations=8 tests/gpu > $OUT/t_gpu.log 2>&1; echo "rc=$?"; grep -E "^(/|E )|Error|passed|failed|s call" $OUT/t_gpu.log | head -30
s done
