#!/bin/bash
# Session of 2026-12-04, 14:51, call 2: SMALL_TILE = 8192 by default (call 1: the step graph 1.05x, k3-small's
# verify 1.065x, logits bit-equal); FUSED_EMBED as a knob. All GPU tests; the step graph's timeline; the served
# benchmark; k3-mini's batch-1 decode graph with the embedding and first norm fused and not.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 300 python3 -m pytest -q -n 8 tests/gpu > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20
s timeline
timeout 110 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --modes dspark+overlap,plain+overlap \
  --prompts 4 --new-tokens 96 --context-lookup on --top 5 --timeline > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -aoE "== (plain|dspark).*|graph alone.*|phases alone.*|timeline \(.*" $OUT/timeline.log
grep -a -A24 "charged time by kernel" $OUT/timeline.log | head -26
s embed_knob
timeout 120 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1 --rounds 6 \
  --knob kestrel.models.k3.FUSED_EMBED=False,True > $OUT/embed_knob.log 2>&1
echo "rc=$?"; tail -5 $OUT/embed_knob.log
s spec
timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --sections 2 --prompts 12 --stop-at-eos \
  > $OUT/spec.log 2>&1
echo "rc=$?"; grep -E "decode: plain|tokens per verify|identical|end to end" $OUT/spec.log | head -20
s done
