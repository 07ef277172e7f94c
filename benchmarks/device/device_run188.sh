#!/bin/bash
# 2026-12-08 01:33 session (issue 9): first the figure the target is set on (the bandwidth floor and k3-mini's
# default batch-1 decode graph; asked for the H200, an H100 may come); then three knobs, off by default, that take
# repeated activations off decode kernels after their waits: the expert up GEMV's activation spread over the threads
# (kestrel.ops.moe.triton.ACT_SPREAD), the shared experts' activation computed by that GEMV for the paired tail
# (kestrel.ops.moe.SHARED_ACT_IN_EXPERTS) and KDA's output-gate sigmoid computed beside the recurrence for the o_proj
# prologue (kestrel.ops.kda.OUT_GATE_IN_RECUR): their tests, k3-mini's decode graph turn about at batches 1 and 8,
# and the floor run again with all three on; a timeline (charged time by kernel) with each floor. ~8 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
M=kestrel.ops.moe.triton
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "floor and the default graph"
timeout 120 python3 benchmarks/decode_ladder.py --skip-hf --skip-ladder --batches 1 --timeline-batches 1 \
  --timeline-top 12 --out $OUT > $OUT/floor.log 2>&1
echo "rc=$?"; grep -vE "^\s*$|UserWarning|_warn_once" $OUT/floor.log | tail -22
s "tests: the spread activation, the expert kernels, the model"
timeout 130 python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu/test_kernels.py tests/gpu/test_moe_kernels.py tests/gpu/test_model_gpu.py \
  tests/gpu/test_linear_kernels.py \
  -k "activation_spread or shared_experts_activation or moe or pair or prologue or output_gate" \
  > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -16
s "decode_knobs: ACT_SPREAD, SHARED_ACT_IN_EXPERTS, OUT_GATE_IN_RECUR, batches 1, 8"
timeout 200 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob $M.ACT_SPREAD=False,True --knob kestrel.ops.moe.SHARED_ACT_IN_EXPERTS=False,True \
  --knob kestrel.ops.kda.OUT_GATE_IN_RECUR=False,True > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]|Error" $OUT/knobs.log
s "floor and graph with all three on"
timeout 120 python3 -c "
import runpy, sys
import kestrel.ops.kda as KO, kestrel.ops.moe as MO, kestrel.ops.moe.triton as M
M.ACT_SPREAD = MO.SHARED_ACT_IN_EXPERTS = KO.OUT_GATE_IN_RECUR = True
sys.argv = ['decode_ladder.py', '--skip-hf', '--skip-ladder', '--batches', '1', '--timeline-batches', '1',
            '--timeline-top', '12', '--out', sys.argv[1]]
runpy.run_path('benchmarks/decode_ladder.py', run_name='__main__')" $OUT > $OUT/floor_spread.log 2>&1
echo "rc=$?"; grep -vE "^\s*$|UserWarning|_warn_once" $OUT/floor_spread.log | tail -22
s done
