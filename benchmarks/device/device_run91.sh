#!/bin/bash
# Session of 2026-12-02, 15:28: the GPU engine and model tests on this tree (the speculative worker now folds the
# KDA layers through kda_ops.fold_layers, one fold kernel a layer on CUDA, inside the captured greedy step), then
# section 2 of the speculative benchmark on the H200 (bf16, bundled k3-small + drafter), stopping at EOS as served.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 400 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -4 $OUT/tests.log
s spec
timeout 160 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log
s done
