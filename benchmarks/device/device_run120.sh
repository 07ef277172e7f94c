#!/bin/bash
# Session of 2026-12-03, 18:42, call 1: the whole GPU suite on the committed tree (last whole run: 2026-12-01 23:10),
# then where a batch-1 verify's cost over a decode step goes on k3-small (benchmarks/verify_cost.py: graph times of
# the decode and of verify blocks of 2, 4, 8 tokens, and the timelines of the decode and of the 8-token block).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s suite
timeout 330 python3 -m pytest -q -n 8 tests/gpu > $OUT/suite.log 2>&1
echo "rc=$?"; tail -2 $OUT/suite.log; grep -E "^FAILED|^ERROR" $OUT/suite.log | head -20
s verify-cost
timeout 150 python3 benchmarks/verify_cost.py --preset k3-small --out $OUT > $OUT/verify_cost.out 2>&1
echo "rc=$?"; grep -vE "^\s+[0-9.]+ us" $OUT/verify_cost.out | tail -30
s done
