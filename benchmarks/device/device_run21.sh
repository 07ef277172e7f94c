#!/bin/bash
# Call 5 of the 17:25 session: call 4's ladder reported the fused-prologue graph 0.6 (relative) away from the
# unfused one on k3-mini, while the interpreter gives 2e-6 in fp32 on k3-mini shapes. Each kept stage now also
# runs its own kernels launched plainly: bit-equality there rules a PDL race in or out at k3-mini's shapes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s ladder; timeout 300 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|rel err|^interleaved|verify step|Error" $OUT/ladder_stdout.log | head -40
grep -A12 "^timeline" $OUT/ladder_stdout.log | head -28
s done
