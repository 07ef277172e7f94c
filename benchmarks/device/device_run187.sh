#!/bin/bash
# 2026-12-07 23:02 session (issue 9): only the figure the target is set on, for the H200 (asked for; an H100 may
# come): the bandwidth floor and k3-mini's default batch-1 decode graph, synced and back to back. About 1 minute.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 140 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --out $OUT > $OUT/floor.log 2>&1
echo "rc=$?"; grep -vE "^\s*$|UserWarning|_warn_once" $OUT/floor.log | tail -8
