#!/bin/bash
# 2026-12-06 20:22 session (issue 9): MLA prefill of many sequences in one varlen launch (mla.PACKED_PREFILL, the
# kernel _attn_varlen_kernel): the attention kernel tests and the model and engine GPU tests, then
# benchmarks/prefill_batch.py (packed against one sequence at a time, turn about) on k3-mini and k3-small.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== GPU tests ($(date +%T))"
timeout 200 python3 -m pytest -q -n 8 tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py "tests/gpu/test_kernels.py::test_attention_varlen" "tests/gpu/test_kernels.py::test_attention_with_lse" > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|Error" $OUT/suite.log | head -10
for m in k3-mini k3-small; do
  echo "== prefill_batch $m ($(date +%T))"
  timeout 140 python3 benchmarks/prefill_batch.py --model $m --prompts 64 --prompt-len 64 --rounds 5 2>&1 | tail -5
done
# then, in the same lease (one command): the whole GPU suite (tests/gpu tests/spec/test_drafter.py -n 8) and
# benchmarks/prefill_batch.py --model k3-mini --prompts 16 --prompt-len 512 --rounds 3
