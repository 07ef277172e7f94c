#!/bin/bash
# 2026-12-07 12:15 session (issue 9; not run then, no machine): what one AttnRes settle costs on the chain against a
# GEMV boundary and a one-CTA norm (benchmarks/settle_chain.py); the GPU suite on the tree that lands (the persistent
# MoE block removed); the engine's default batch-1 decode graph against this card's bandwidth floor. About 5 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== settle chain ($(date +%T))"
timeout 120 python3 benchmarks/settle_chain.py --dim 2048 --links 48 --banks 1,6 2>&1 | grep -v Warning | tee $OUT/settle.log | tail -12
echo "== GPU suite ($(date +%T))"
timeout 250 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
echo "== batch-1 decode graph, default kernels ($(date +%T))"
timeout 150 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "floor|tok/s|Error" $OUT/ladder.log | tail -8
echo "== done ($(date +%T))"
