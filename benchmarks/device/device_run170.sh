#!/bin/bash
# 2026-12-07 12:15 session: the GPU suite on the tree that lands (the persistent MoE block removed; routes_in_kernel
# now asks route_row_serves), then the engine's default batch-1 decode graph against this card's bandwidth floor.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== GPU suite ($(date +%T))"
timeout 250 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
echo "== batch-1 decode graph, default kernels ($(date +%T))"
timeout 150 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|tok/s|Error" $OUT/ladder.log | tail -8
echo "== done ($(date +%T))"
