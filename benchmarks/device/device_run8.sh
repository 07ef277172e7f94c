#!/bin/bash
# Evening call 1: fused AttnRes settle + MoE residual epilogue + programmatic dependent launch (PDL). The PDL
# race test first (PDL stays off for the rest if it fails), the GPU suite, the ladder, then DSpark with the
# drafter distilled on the H200 (batch 1 and the throughput sweep to 256).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s pdl; timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py -k pdl > $OUT/t_pdl.log 2>&1; rc=$?; echo "rc=$rc"; tail -3 $OUT/t_pdl.log
[ $rc -ne 0 ] && export KESTREL_PDL=0 && echo "PDL OFF for the rest"
s tests; timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=line tests/gpu > $OUT/t_gpu.log 2>&1; echo "rc=$?"; grep -E "^(/|E )|Error|passed|failed" $OUT/t_gpu.log | head -20
s ladder; timeout 130 python3 benchmarks/decode_ladder.py --out $OUT --skip-sweep --skip-hf > $OUT/ladder_stdout.log 2>&1; echo "rc=$?"
grep -E "^stage|bit-equal|graph vs|kernel time|^  |verify step" $OUT/ladder_stdout.log | head -40
s spec; timeout 190 python3 benchmarks/speculative.py --device cuda --dtype bfloat16 --prompts 8 --sections 2,3 --batches 1,64,256 --out $OUT/speculative.json > $OUT/spec.log 2>&1; echo "rc=$?"; grep -v Warn $OUT/spec.log | tr '\r' '\n' | grep -E "^ +[a-z]|^[0-9]" | tail -12
s done
