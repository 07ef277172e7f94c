#!/bin/bash
# 2026-12-06 22:36 session (issue 9): where a GPU prefill of many prompts goes. benchmarks/prefill_batch.py --profile
# (packed MLA attention; one more round under the torch profiler: device time by kernel against the wall time) on
# k3-mini 64 x 64 and 16 x 512, and k3-small 64 x 64.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for spec in "k3-mini 64 64" "k3-mini 16 512" "k3-small 64 64"; do
  set -- $spec
  echo "== prefill_batch $1 $2 x $3 ($(date +%T))"
  timeout 170 python3 benchmarks/prefill_batch.py --model $1 --prompts $2 --prompt-len $3 --rounds 3 --profile --top 30 2>&1 | grep -v "^loading" | tail -40
done
