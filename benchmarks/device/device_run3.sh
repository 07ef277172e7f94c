#!/bin/bash
# Third device call: DSpark speculative decoding on the H200 (exactness against plain decoding, then the benchmark).
export PYTHONPATH=. PYTHONUNBUFFERED=1


timeout 120 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --batches 1,16,64,256 --skip-acceptance \
    --out $OUT/speculative.json 2>&1 | grep -v Warning
echo "bench rc=$?"
