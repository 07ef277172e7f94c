#!/bin/bash
# 2026-12-07 14:30 session, third call (issue 9): the tree that lands (the settle in one layout, the 1-D form and
# the one-buffer bank removed): the default batch-1 decode graph against the card's floor, then the GPU suite.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "batch-1 decode graph, default kernels"
timeout 80 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|back to back" $OUT/ladder.log | head -4
s "GPU suite"
timeout 185 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -1 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
s done
