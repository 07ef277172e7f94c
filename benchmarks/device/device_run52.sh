#!/bin/bash
# Session of 2026-12-01, 01:16, call 6: the routing chosen by the router GEMV's last program (ncu, call 5: the
# up GEMV issue-bound, its 512 programs and the down GEMV's each ranking 128 experts). Kernel tests, the engine
# and model files, then the ladder (its new stage) and the per-kernel Nsight Compute table again.
# (The router-chooses-the-experts variant and ncu_decode.py's --route-in-router flag were removed after call 7.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
s kernels; timeout -k 5 150 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/gpu/test_kernels.py -k "moe or route or router or linear" > $OUT/t_k.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/t_k.log | head -12
s "engine+model"; timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py > $OUT/t_em.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" $OUT/t_em.log | head -20
s ladder; timeout -k 5 200 python3 benchmarks/decode_ladder.py --skip-sweep --skip-hf --out $OUT > $OUT/ladder_stdout.log 2>&1
echo "rc=$?"; grep -E "PDL graph bit-equal|vs |interleaved|^\| |verify step|Error|error" $OUT/ladder_stdout.log | head -40
grep -A29 "timeline (+ routing in router), kernels" $OUT/decode_ladder.log | head -30
s done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
for r in long_scoreboard short_scoreboard barrier membar wait lg_throttle drain no_instruction math_pipe_throttle mio_throttle not_selected selected; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
s ncu; timeout -k 5 200 ncu --profile-from-start off -k regex:'_gemv_up|_gemv_down|_gemv_kernel' --launch-count 24 --csv --metrics $M python3 benchmarks/ncu_decode.py --route-in-router 1 > $OUT/ncu.csv 2> $OUT/ncu.err
echo "rc=$?"; python3 benchmarks/ncu_table.py $OUT/ncu.csv | tee $OUT/ncu_table.txt | head -30
s done2
