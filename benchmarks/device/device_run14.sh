#!/bin/bash
# (PDL became the default after this ran: the flags here are the current spelling of what ran then)
# Call 4: (1) the engine / model GPU tests with PDL that calls 2-3 could not finish (out of memory under 8
# workers; a serial run too slow to reach them); (2) the throughput sweep with the planner's online guard;
# (3) the batch-1 A/B, PDL off then on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "pdl engine/model"; timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py -k "speculative_greedy or graph_decode_matches_eager" > $OUT/t_pdl.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_pdl.log | head -8
s sweep; timeout 160 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 3 --batches 16,64,256 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "rc=$?"; grep -E "^   batch" $OUT/sweep.log
for p in --disable-pdl ""; do s "b1 $p"; timeout 85 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2 $p --out $OUT/b1$p.json > $OUT/b1$p.log 2>&1; grep -E "plain .*tok/s" $OUT/b1$p.log; done
s done
