#!/bin/bash
# Session of 2026-12-03, 14:02, call 2: a larger DSpark drafter (width 256, 3 slot layers, SwiGLU 768; 3.3 M
# trainable parameters against the bundled 1.37 M), distilled as device_run7.sh distilled the bundled one but on
# 12,000 + 4,000 prompts (the call's time limit), to see whether the drafter's size limits its acceptance (the
# session of 2026-12-02 13:28 found 2.2x the data did not raise it). Held-out acceptance lands in distill.log.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s distill
timeout 575 python3 -m kestrel.cli distill --device cuda --out $OUT/drafter --work-dir /tmp/dspark \
  --code-prompts 12000 --arith-prompts 4000 --gen-batch 256 --steps 6000 --batch-size 512 --max-minutes 3.6 \
  --hidden-size 256 --num-layers 3 --intermediate-size 768 --no-progress > $OUT/distill.log 2>&1
echo "rc=$?"; tail -12 $OUT/distill.log; grep -i "heldout\|accepted" $OUT/distill.log | tail -6
s done
