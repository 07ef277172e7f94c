#!/bin/bash
# Third device call of the afternoon: the whole GPU test suite, then DSpark on the H200 (batch 1 with its phase
# breakdown, throughput to batch 256 for no speculation / verify-all / planned).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests; timeout 250 python3 -m pytest -q -p no:cacheprovider --tb=line tests/gpu > $OUT/t_gpu.log 2>&1; echo "rc=$?"; grep -E "^(/|E )|Error|passed|failed" $OUT/t_gpu.log | head -20
s spec; timeout 300 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2,3 --batches 1,16,64,256 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -v Warn $OUT/spec.log | tr '\r' '\n' | grep -E "^ +[a-z]|^[0-9]" | tail -12
s done
