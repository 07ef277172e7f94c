#!/bin/bash
# 2026-12-06 02:44 session (issue 9): the decode ladder on the H200 only (an H100 exits at once: its figures for this
# tree are device_run157's).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee /dev/stderr | grep -q H200 || { echo "not an H200"; exit 3; }
echo "== ladder ($(date +%T))"
timeout 300 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "^\| |Error|back to back|copy bandwidth" $OUT/ladder.log | tail -22
