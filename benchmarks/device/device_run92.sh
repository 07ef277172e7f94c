#!/bin/bash
# Session of 2026-12-02, 15:28, call 2: the KDA prep and recurrence kernels read what no kernel of their step writes
# (the recurrent state, the conv tail, the conv weights, the gate's parameters) before their PDL wait
# (kda/triton.py EARLY_STATE). The KDA kernel tests, the decode ladder with the new last stage (interleaved against
# the paired-MoE-tail stage; PDL graph vs plain launches must stay bit-equal), then the engine and model tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernel-tests
timeout 200 python3 -m pytest -q -n 4 tests/gpu/test_kernels.py -k "kda or fold or verify" > $OUT/kernels.log 2>&1
echo "rc=$?"; tail -3 $OUT/kernels.log; grep -E "^FAILED|Error" $OUT/kernels.log | head -5
s ladder
timeout -k 5 330 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "floor 0|bit-equal|vs waiting|interleaved|^stage|Error|error" $OUT/ladder_stdout.log | tail -24
s engine-tests
timeout 150 python3 -m pytest -q -n 4 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py > $OUT/engine.log 2>&1
echo "rc=$?"; tail -2 $OUT/engine.log
s done
