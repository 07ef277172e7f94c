#!/bin/bash
# 2026-12-06 20:22 session (issue 9): the AttnRes settle as the epilogue of the GEMV that ends each sublayer
# (attn_res.FUSE_SETTLE): the GPU suite, then the decode ladder (its last stage against the one before,
# interleaved and back to back turn about, with both stages' timelines).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== GPU suite ($(date +%T))"
timeout 230 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|Error" $OUT/suite.log | head -10
echo "== ladder ($(date +%T))"
timeout 330 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error|back to back|copy bandwidth|epilogue|interleaved|turn about|kernels a step" $OUT/ladder.log | tail -34
