#!/bin/bash
# 2026-12-06 22:36 session (issue 9): the prefill's host-device synchronisations removed (ops.host_ints: metadata
# lists copied without waiting for the queue) and the GPU's chunked prefill default by memory (8192 on an 80 GB
# card). The GPU suite, then benchmarks/prefill_batch.py with the tree of 0721a78 (build/base.tgz, carried) against
# this tree, turn about, at chunk 2048; this tree at its default chunk; and its synchronisations left.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
mkdir -p build/base && tar -xzf build/base.tgz -C build/base && ln -sfn $PWD/kestrel/assets build/base/kestrel/assets
echo "== GPU suite ($(date +%T))"
PYTHONPATH=. timeout 280 python3 -m pytest -q -n 8 tests/gpu tests/spec/test_drafter.py > $OUT/suite.log 2>&1
echo "rc=$?"; tail -3 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -10
run() {  # side model prompts len [extra args]
  local side=$1 m=$2 n=$3 l=$4; shift 4
  local pp=.; [ $side = base ] && pp=build/base
  echo "-- $side $m $n x $l $* ($(date +%T))"
  PYTHONPATH=$pp timeout 100 python3 benchmarks/prefill_batch.py --model $m --prompts $n --prompt-len $l --rounds 3 "$@" 2>&1 | grep -E "packed|sequence at|synchronising|^ +[0-9]+x"
}
for side in base new; do run $side k3-mini 64 64 --chunked-prefill-size 2048; done
run new k3-mini 64 64
for side in base new; do run $side k3-mini 16 512 --chunked-prefill-size 2048; done
run new k3-mini 16 512
for side in base new; do run $side k3-small 64 64 --chunked-prefill-size 2048; done
run new k3-mini 64 64 --sync-debug
echo "-- new k3-mini 64 x 64, default chunk, ops by call site ($(date +%T))"
PYTHONPATH=. timeout 100 python3 benchmarks/prefill_batch.py --model k3-mini --prompts 64 --prompt-len 64 --rounds 1 --ops --top 45 2>&1 | grep -v "^loading\|UserWarning\|_warn_once" | tail -47
