#!/bin/bash
# (PDL became the default after this ran: the flags here are the current spelling of what ran then)
# Morning-after call 1: (1) the GPU suite without the PDL test, per-test timeout so a stall names its test;
# (2) the PDL test alone, twice (the evening's stall); (3) the batch-1 engine A/B, PDL off then on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
s tests; timeout -k 5 250 python3 -m pytest -q -p no:cacheprovider --tb=short -o faulthandler_timeout=60 -k "not pdl" tests/gpu > $OUT/t_gpu.log 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" $OUT/t_gpu.log | head -30
s pdl; for i in 1 2; do timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider --tb=short -o faulthandler_timeout=30 -k pdl tests/gpu/test_model_gpu.py > $OUT/t_pdl$i.log 2>&1; echo "rc=$?"; grep -E "passed|failed|Timeout|File \"/" $OUT/t_pdl$i.log | head -12; done
s ab; for p in --disable-pdl ""; do timeout 90 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 $p --out $OUT/spec_b1$p.json > $OUT/spec_b1$p.log 2>&1; echo "[$p] rc=$?"; grep -E "tok/s|step|x$" $OUT/spec_b1$p.log | tail -6; done
s done
