#!/bin/bash
# 2026-12-05 15:25 session (issue 9): the expert up and down GEMVs as one launch of ticketed programs
# (moe.triton.FUSED_UPDOWN, off by default until measured). Its kernel test; the model and engine GPU tests with it
# forced on; then the k3-mini batch-1 decode graph with and without it, turn about (the ladder's tile sweep).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s "kernel tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "moe or route" > $OUT/kt.log 2>&1
echo "rc=$?"; tail -1 $OUT/kt.log; grep -E "^FAILED|^E  " $OUT/kt.log | cut -c1-400 | head -10
s "model/engine tests, fused on"
timeout 260 python3 -c "
import sys, pytest, kestrel.ops.moe.triton as K
K.FUSED_UPDOWN = True
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/gpu/test_model_gpu.py', 'tests/gpu/test_engine_gpu.py', '-k', 'not speculative']))
" > $OUT/mt.log 2>&1
echo "rc=$?"; tail -1 $OUT/mt.log; grep -E "^FAILED|^E  " $OUT/mt.log | cut -c1-400 | head -10
s "ladder tile sweep"
timeout 330 python3 benchmarks/decode_ladder.py --skip-hf --skip-sweep --tile-sweep --out $OUT > $OUT/ladder.log 2>&1
echo "rc=$?"; grep -E "interleaved|floor|Error" $OUT/ladder.log | tail -14
s done
