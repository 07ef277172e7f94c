#!/bin/bash
# One device call: install carried wheels, run the GPU tests, the decode ladder and the kernel table; logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider --timeout 120 tests/gpu > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|error" $OUT/tests.log | tail -15
timeout ${T_LADDER:-240} python3 benchmarks/decode_ladder.py --out $OUT $LADDER_ARGS > $OUT/ladder_stdout.log 2>&1
echo "ladder rc=$?"
timeout ${T_KERNELS:-150} python3 benchmarks/kernels.py --out $OUT $KERNEL_ARGS > $OUT/kernels_stdout.log 2>&1
echo "kernels rc=$?"
tail -22 $OUT/ladder_stdout.log
tail -30 $OUT/kernels_stdout.log
