#!/bin/bash
# 2026-12-06 05:11 session (issue 9): the settle with the bank pre-summed before its wait (attn_res.triton.PRESUM):
# the GPU suite, then the decode ladder (its last stage against the one before, interleaved and back to back).
# Ran on the tree of 0e11d03 (an H100 came): no gain, and the knob was removed after it; see docs/kernels.md.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== GPU suite ($(date +%T))"
timeout 220 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|Error" $OUT/suite.log | head -10
echo "== ladder ($(date +%T))"
timeout 330 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error|back to back|copy bandwidth|pre-summed|interleaved|turn about" $OUT/ladder.log | tail -30
