#!/bin/bash
# 2026-12-07 16:37 session (issue 9): the tree with the channel-column KDA prep as the default (CHANNELS_FIRST,
# fp fusion off in the prep kernel): the GPU suite, then the default batch-1 decode graph against the card's floor.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "batch-1 decode graph, default kernels"
timeout 80 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|back to back" $OUT/ladder.log | head -4
s "GPU suite"
timeout 220 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -1 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
s done
