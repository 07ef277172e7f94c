#!/bin/bash
# Second device call: re-check the fixed kernels, the ladder stages with a kernel-time breakdown, the kernel table.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 75 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "kda_decode or chunked or model" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|assert" $OUT/tests.log | tail -12
timeout 100 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1
echo "ladder rc=$?"
timeout 85 python3 benchmarks/kernels.py --out $OUT --quick --sections chunk,decode,mla,moe --heads 16,96 > $OUT/kernels_stdout.log 2>&1
echo "kernels rc=$?"
grep -E "^stage|graph vs|kernel time|^  " $OUT/ladder_stdout.log
grep -E "^(kda|mla|moe|route|attention)" $OUT/kernels.log
