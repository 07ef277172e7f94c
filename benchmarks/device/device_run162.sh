#!/bin/bash
# 2026-12-06 20:22 session (issue 9): MLA prefill of many sequences in one varlen launch (mla.PACKED_PREFILL, the
# kernel _attn_varlen_kernel): the GPU suite, then benchmarks/prefill_batch.py (packed against one sequence at a
# time, turn about) on k3-mini and k3-small.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== GPU suite ($(date +%T))"
timeout 240 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|Error" $OUT/suite.log | head -10
for m in k3-mini k3-small; do
  echo "== prefill_batch $m ($(date +%T))"
  timeout 150 python3 benchmarks/prefill_batch.py --model $m --prompts 64 --prompt-len 64 --rounds 5 2>&1 | tail -5
done
echo "== prefill_batch k3-mini, 16 x 512 ($(date +%T))"
timeout 100 python3 benchmarks/prefill_batch.py --model k3-mini --prompts 16 --prompt-len 512 --rounds 3 2>&1 | tail -5
