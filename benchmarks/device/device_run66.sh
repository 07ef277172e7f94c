#!/bin/bash
# Session of 2026-12-01, 06:00, call 3: what the small-weight GEMV rule does to decode at batches 1-8 and to a verify
# step (k3-small and k3-mini, the two routings side by side), and the DSpark step's phases (draft, verify, fold
# graphs alone) with the kernel table under plain launches (each kernel's own time, no PDL waits).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s small; timeout -k 5 240 python3 benchmarks/small_gemv.py --out $OUT > $OUT/small.out 2>&1
echo "rc=$?"; grep -E "^\||Error" $OUT/small.out
s host; timeout -k 5 100 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 40 --modes dspark > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |GPU kernels|graph alone|phases|Error"
s host-nopdl; timeout -k 5 100 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 2 --new-tokens 64 --top 40 --modes dspark --disable-pdl > $OUT/host_nopdl.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host_nopdl.log | grep -E "^== |GPU kernels|graph alone|phases|Error"
s done
