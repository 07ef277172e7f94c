#!/bin/bash
# 2026-12-06 20:22 session (issue 9): the settle epilogue again, its GEMVs capped at 96 registers a thread
# (linear.triton.SETTLE_MAXNREG; call 160 found 164 without the cap, so the fused GEMVs streamed in two waves):
# the settle tests and the model tests, then the decode ladder (last stage against the one before, turn about).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== settle and model tests ($(date +%T))"
timeout 150 python3 -m pytest -q -n 8 tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_linear_kernels.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|Error" $OUT/suite.log | head -10
echo "== ladder ($(date +%T))"
timeout 330 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error|back to back|copy bandwidth|epilogue|turn about|kernels a step" $OUT/ladder.log | tail -16
grep -A8 "timeline (+ settle epilogue): " $OUT/ladder.log
