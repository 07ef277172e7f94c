#!/bin/bash
# 2026-12-07 23:02 session (issue 9): the expert up and down GEMVs and the MoE tail's paired GEMV with their weight
# tiles staged in shared memory before the PDL wait (kestrel/ops/moe/staged.py, kestrel/ops/linear/staged.py, Gluon;
# knobs kestrel.ops.moe.triton.UP_STAGED / DOWN_STAGED, kestrel.ops.linear.triton.PAIR_STAGED, off by default).
# Their tests first; then k3-mini's decode graph turn about, each against the default: the routing before the experts
# (which the staged expert kernels need) alone, each staged kernel; then the down on top of the up; then the floor
# and a timeline with the up and down on. ~5 minutes.
# Ran once (call 186, H100): the staged kernels lost and were removed after it; this script needs tree 6f7c054.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
s() { echo "== $1 ($(date +%T))"; }
M=kestrel.ops.moe.triton
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s "staged expert GEMV tests (kernel, model)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu/test_kernels.py tests/gpu/test_model_gpu.py \
  tests/gpu/test_linear_kernels.py -k "staged or test_moe_experts or test_linear_pair" > $OUT/tests.log 2>&1
echo "rc=$?"; tail -1 $OUT/tests.log; grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -16
s "decode_knobs: routing first; staged up; staged down; staged pair; batches 1, 8"
timeout 200 python3 benchmarks/decode_knobs.py --preset k3-mini --batches 1,8 --rounds 6 \
  --knob $M.ROUTE_IN_KERNEL_MAX_TOKENS=1,0 --knob $M.UP_STAGED=False,True --knob $M.DOWN_STAGED=False,True \
  --knob kestrel.ops.linear.triton.PAIR_STAGED=False,True > $OUT/knobs.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]|Error" $OUT/knobs.log
s "decode_knobs with UP_STAGED on: the staged down on top, batches 1, 8"
timeout 120 python3 -c "
import runpy, sys
import kestrel.ops.moe.triton as M
M.UP_STAGED = True
sys.argv = ['decode_knobs.py', '--preset', 'k3-mini', '--batches', '1,8', '--rounds', '6', '--knob',
            'kestrel.ops.moe.triton.DOWN_STAGED=False,True']
runpy.run_path('benchmarks/decode_knobs.py', run_name='__main__')" > $OUT/knobs2.log 2>&1
echo "rc=$?"; grep -E "^\| [0-9]|Error" $OUT/knobs2.log
s "floor, graph and timeline with both on"
timeout 140 python3 -c "
import runpy, sys
import kestrel.ops.moe.triton as M
M.UP_STAGED = M.DOWN_STAGED = True
sys.argv = ['decode_ladder.py', '--skip-hf', '--skip-ladder', '--batches', '1', '--timeline-batches', '1',
            '--timeline-top', '14', '--out', sys.argv[1]]
runpy.run_path('benchmarks/decode_ladder.py', run_name='__main__')" $OUT > $OUT/timeline.log 2>&1
echo "rc=$?"; grep -vE "^\s*$|UserWarning|_warn_once" $OUT/timeline.log | tail -20
s done
