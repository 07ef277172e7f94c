#!/bin/bash
# 2026-12-07 05:16 session (issue 9), the second call of a lease after device_run168.sh: the decode ladder with one
# more stage, each k3-mini MoE block as one persistent launch (kestrel.ops.moe.PERSISTENT_BLOCK), against the last
# stage interleaved and back to back, turn about.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== ladder ($(date +%T))"
timeout 420 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --persistent-moe --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error|error|back to back|copy bandwidth|persistent|interleaved|turn about" $OUT/ladder.log | tail -40
echo "== done ($(date +%T))"
