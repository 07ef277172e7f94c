#!/bin/bash
# 2026-12-07 02:51 session (issue 9): what a kernel boundary costs on a chain of dependent GEMVs, PDL launches in one
# graph against one persistent kernel with grid-wide barriers (benchmarks/persistent_chain.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== persistent chain ($(date +%T))"
timeout 180 python3 benchmarks/persistent_chain.py --dims 512,1024,2048 --layers 96 --rows 4,8,16 2>&1 | tee $OUT/chain.log | grep -v Warning
echo "rc=${PIPESTATUS[0]} ($(date +%T))"
echo "== done ($(date +%T))"
