#!/bin/bash
# Session of 2026-12-03, 18:42, call 2: (a) the context lookup's gate as kernels (the first position's confidence
# from the head kernel's per-tile summaries and one confidence kernel; the lookup step choosing the drafts; the
# window append), (b) the KDA verify without its input copy and output fill (strided block rows read in place, zeros
# for padding steps written by the recurrence). The whole GPU suite; the verify's cost against a decode step, with
# the shared experts on their stream and in line; the speculative benchmark as served, lookup on, then off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s suite
timeout 330 python3 -m pytest -q -n 8 tests/gpu > $OUT/suite.log 2>&1
echo "rc=$?"; tail -2 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -20
s verify-cost
timeout 150 python3 benchmarks/verify_cost.py --preset k3-small --shared-stream-off --out $OUT > $OUT/verify_cost.out 2>&1
echo "rc=$?"; grep -E "^\|" $OUT/verify_cost.out
s spec-on
timeout 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 1,2 --prompts 12 --stop-at-eos \
  --context-lookup on > $OUT/spec_on.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_on.log
s spec-off
timeout 110 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  --context-lookup off > $OUT/spec_off.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec_off.log
s done
