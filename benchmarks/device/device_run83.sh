#!/bin/bash
# Session of 2026-12-01, 19:20, call 4: the batch-1 prefill again after the packed conv's single-sequence path
# (call 3: 20-25 ms of wall time against ~2 ms of device time), the GPU model tests over that path, and section 2
# of the speculative benchmark with caching-allocator retries counted (the ~1 s gaps of DSpark's end-to-end runs).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s model; timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py > $OUT/t_m.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" $OUT/t_m.log | head -20
s prefill; timeout -k 5 100 python3 benchmarks/prefill_profile.py --device cuda --dtype bfloat16 --lens 16,41,80,300 --top 30 > $OUT/plain.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/plain.log | grep -v "loading weights" | grep -E "^\|| ms|Error" | tail -7
s spec; timeout -k 5 220 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|timed runs|one speculative|Error"
s done
