#!/bin/bash
# Prepared in the session of 2026-12-01, 14:26 (not run there: the device time was spent). Decode-only kernel tables
# of plain and DSpark steps (which verify kernels cost more than their decode twins), and section 2 of the
# speculative benchmark with its end-to-end split (where DSpark+overlap's extra ~0.8 s goes).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s host; timeout -k 5 200 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 4 --new-tokens 64 --top 30 --modes plain+overlap,dspark+overlap > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "^== |GPU kernels|graph alone|phases|Error"
s spec; timeout -k 5 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|timed runs|one speculative|Error"
s done
