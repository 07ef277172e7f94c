#!/bin/bash
# Session of 2026-12-03, 14:02, call 1: every GPU test on the tree after the CPU reference's inverse-then-product
# chunked KDA (f1ab59d, not yet run on the GPU) and this session's CPU speculative changes (folded CPU drafting,
# the CPU greedy step's lazy LM head, the KDA verify's cached masks: CPU paths, the GPU's untouched); then the
# speculative benchmark's batch-1 section on the H200 as served (bf16, bundled k3-small + drafter).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 420 python3 -m pytest -q -n 4 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s spec
timeout 150 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log
s done
