#!/bin/bash
# Session of 2026-12-01, 04:18, call 1: the greedy speculative step as one CUDA graph (draft, verify, accept on the
# device, fold, next features; one copy in, one launch, one copy back). Engine GPU tests (the new graph-vs-host
# acceptance test among them), the fold kernel with device-form snapshots, issue 8's batch-1 comparison and the
# host profile of both modes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "tests"; timeout -k 5 260 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py "tests/gpu/test_kernels.py::test_kda_verify_and_fold" > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_e.log | head -20
s spec; timeout -k 5 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "plain .*tok/s|identical|one speculative|Error" $OUT/spec.log
s host; timeout -k 5 150 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 16 > $OUT/host.log 2>&1
echo "rc=$?"; grep -E "== plain|== dspark|profiled|GPU kernels" $OUT/host.log | sed 's/.*\r//'
grep -A17 "GPU kernels" $OUT/host.log | tail -17
s done
