#!/bin/bash
# Ran in the 2026-12-07 12:15 session on tree c2aba27 (H100); persistent_moe.py and its test were removed after (tree d977d36 has them).
# 2026-12-07 05:16 session (issue 9): the k3-mini MoE block as one persistent kernel against the model's five PDL
# launches (benchmarks/persistent_moe.py) and its GPU test, then what a kernel boundary costs
# (benchmarks/persistent_chain.py, the never-run device_run167.sh).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== persistent MoE block ($(date +%T))"
timeout 210 python3 benchmarks/persistent_moe.py --layers 23 --configs 1x:16,1x:16:l2 --rounds 3 2>&1 | tee $OUT/moe.log | grep -v Warning
echo "rc=${PIPESTATUS[0]} ($(date +%T))"
echo "== persistent MoE test ($(date +%T))"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_persistent_moe.py 2>&1 | tail -5
echo "== persistent chain ($(date +%T))"
timeout 90 python3 benchmarks/persistent_chain.py --dims 1024,2048 --layers 96 --rows 4,16 2>&1 | tee $OUT/chain.log | grep -v Warning
echo "rc=${PIPESTATUS[0]} ($(date +%T))"
echo "== done ($(date +%T))"
