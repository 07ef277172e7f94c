#!/bin/bash
# Session of 2026-12-01, 08:30, call 2: why end to end falls with chained speculative steps (section 2 with the
# prefill gaps between requests), then the profile of the chained engine's steps.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s spec; timeout -k 5 170 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|median ms|Error"
s done
