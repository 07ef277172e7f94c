#!/bin/bash
# Session of 2026-12-04, 20:25, call 1: where the served batch-1 DSpark step's time goes beyond its graph
# (benchmarks/served_step.py: graph, + copies in, + result copy, the worker's host path, served), and the served
# ratio on this host.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s served_step
timeout 200 python3 benchmarks/served_step.py --rounds 5 --steps 200 > $OUT/served_step.log 2>&1
echo "rc=$?"; tail -9 $OUT/served_step.log
s "spec 128 x 24"
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --new-tokens 128 \
  --decode-prompts 24 --stop-at-eos > $OUT/spec128.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical" $OUT/spec128.log | cut -c1-400
s done
