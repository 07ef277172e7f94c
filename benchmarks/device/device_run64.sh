#!/bin/bash
# Session of 2026-12-01, 04:18, call 6 (last): the pending-result GPU test, the model GPU tests after the
# differentiable-forward guard, and host_profile after its graph timing moved to benchmarks/common.py.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py::test_pending_result_holds_the_values_at_its_launch tests/gpu/test_model_gpu.py > $OUT/t.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t.log | head
timeout -k 5 80 python3 benchmarks/host_profile.py --device cuda --dtype bfloat16 --prompts 2 --new-tokens 32 --top 3 > $OUT/host.log 2>&1
echo "rc=$?"; tr '\r' '\n' < $OUT/host.log | grep -E "== plain|== dspark|graph alone|Error"
