#!/bin/bash
# Session of 2026-12-02, 18:02, call 2: the ~120-290 us the timelines charge to each step's first kernel. Each
# decode graph timed synced (as the ladder does), back to back (the engine's steady state), and the host's
# launch time, with PDL on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s gap
timeout -k 5 300 python3 benchmarks/graph_gap.py --batches 1,2,8 2>&1 | grep -v Warning | tail -12
s done
