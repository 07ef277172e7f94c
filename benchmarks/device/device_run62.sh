#!/bin/bash
# Session of 2026-12-01, 04:18, call 4: the overlap scheduler on the GPU. The runner stages its inputs through pinned
# memory with non-blocking copies (a blocking copy from pageable memory synchronised the stream) and returns sampled
# tokens as a pending copy resolved on the scheduler's thread, so the next batch launches while the device runs.
# Engine GPU tests (overlap on and off), then issue 8's batch-1 comparison (plain with and without overlap).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "tests"; timeout -k 5 270 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py > $OUT/t_e.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_e.log | head -20
s spec; timeout -k 5 200 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 > $OUT/spec.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/spec.log | grep -E "decode:|end to end|identical|one speculative|Error"
s done
