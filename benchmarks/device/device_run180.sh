#!/bin/bash
# Prepared by the 2026-12-07 16:37 session (issue 9; not run then: the session's device time was spent). The
# k3-mini batch-1 ladder on this tree, with its new last stage "+ KDA prep in channel columns" (the window form
# before it), interleaved and back to back against the floor, and the timelines of its last two stages. Ask for
# the H200 (the target's card); about 5 minutes. The transformers reference needs fla-core carried (see the
# device README): add it and drop --skip-hf for the full table.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 540 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"
grep -E "copy bandwidth|floor|^stage|interleaved|back to back|bit-equal|rel err" $OUT/ladder.log | tail -40
