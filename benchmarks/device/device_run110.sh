#!/bin/bash
# Session of 2026-12-03, 09:05, call 2: the fused KDA decode (one launch) with the KDA recurrent kernels compiled
# without FMA contraction (kda/triton.py: _EXACT), dispatched at one sequence (FUSED_DECODE_MAX_BATCH = 1). The
# KDA kernel tests and the model / engine GPU tests; the decode graph with the fused decode off and on, turn
# about; the batch-1 timeline; the engine's batch-1 decode. Call 1 (device_run109.sh): the fused kernel differed
# from the two launches in the last bits (contraction), 1.025x at batch 1, slower from batch 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py \
  -k "kda or fold or verify or model or engine or graph or pdl or spec" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -12
s knob
timeout -k 5 150 python3 benchmarks/decode_knobs.py --knob kestrel.ops.kda.triton.FUSED_DECODE=False,True \
  --batches 1,2,1 --rounds 8 > $OUT/knob.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/knob.log | tail -8
s timeline
timeout -k 5 100 python3 benchmarks/decode_ladder.py --skip-ladder --skip-hf --batches 1 --timeline-batches 1 \
  --timeline-top 14 > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/timeline.log | tail -17
s engine
timeout -k 5 120 python3 benchmarks/overlap.py --model k3-mini --rounds 3 > $OUT/overlap.log 2>&1
echo "rc=$?"; grep -v Warning $OUT/overlap.log | grep -E "overlap|serial|graph alone|floor" | head -12
s done
