#!/bin/bash
# 2026-12-06 02:44 session (issue 9): the tree of 122274d had been checked on an H100 only (device_run156.sh). On the
# H200, which the issue names: the GPU suite, then the decode ladder (floor and every stage, no HF, no batch sweep).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s tests
timeout 250 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | cut -c1-600 | head -20
s ladder
timeout 300 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error" $OUT/ladder.log | tail -20
s done
