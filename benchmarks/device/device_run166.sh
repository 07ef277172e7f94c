#!/bin/bash
# 2026-12-07 00:42 session. On two GPUs: --dp-size 2 (a replica on each GPU) in the GPU suite
# (tests/gpu/test_data_parallel_gpu.py) and its throughput against one engine (benchmarks/data_parallel.py); the
# suite also checks last session's CPU-only commits (host_ints in the sampler and the speculative worker, the pair
# table's dtype key, int_tensor in kestrel.ops). Then the k3-mini prefill's kernel-launching ops by call site with
# the overlap off, so that the forward's stacks are recorded (the 364 device-to-pinned copies of call 165).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== GPU suite ($(date +%T))"
PYTHONPATH=. timeout 330 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
grep -E "data_parallel" $OUT/suite.log | head -3
[ $(nvidia-smi -L | wc -l) -ge 2 ] && echo "== data parallel, k3-mini ($(date +%T))" && PYTHONPATH=. timeout 240 python3 benchmarks/data_parallel.py --model k3-mini --device cuda --requests 256 \
  --concurrency 128 --prompt-len 128 --new-tokens 64 --rounds 2 --max-total-tokens 100000 2>&1 | grep -v "^loading\|INFO core\|Warning\|warn" | tail -9
echo "== prefill ops, overlap off ($(date +%T))"
PYTHONPATH=. timeout 100 python3 benchmarks/prefill_batch.py --model k3-mini --prompts 64 --prompt-len 64 --rounds 1 \
  --ops --disable-overlap-schedule --top 60 2>&1 | grep -v "^loading\|UserWarning\|_warn_once" | tail -64
echo "== done ($(date +%T))"
