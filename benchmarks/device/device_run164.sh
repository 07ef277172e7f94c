#!/bin/bash
# 2026-12-06 22:36 session (issue 9): call 163 found the GPU prefill of many prompts host-bound (device busy 28-30%
# of the wall on k3-mini). Here: which lines synchronise the host with the device during a packed prefill
# (prefill_batch.py --sync-debug), and the prefill at chunked prefill sizes 2048 (the default) and 8192.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
echo "== sync debug k3-mini 64 x 64 ($(date +%T))"
timeout 150 python3 benchmarks/prefill_batch.py --model k3-mini --prompts 64 --prompt-len 64 --rounds 1 --sync-debug --top 40 2>&1 | grep -v "^loading" | tail -48
for cps in 2048 8192; do
  echo "== k3-mini 16 x 512, chunked prefill $cps ($(date +%T))"
  timeout 120 python3 benchmarks/prefill_batch.py --model k3-mini --prompts 16 --prompt-len 512 --rounds 3 --chunked-prefill-size $cps 2>&1 | grep -v "^loading" | tail -4
done
