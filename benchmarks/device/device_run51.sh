#!/bin/bash
# Session of 2026-12-01, 01:16, call 5: Nsight Compute over one k3-mini batch-1 decode step's first 48 settle /
# GEMV / expert / KDA-prep kernels, each alone (benchmarks/ncu_decode.py, benchmarks/ncu_table.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
for r in long_scoreboard short_scoreboard barrier membar wait lg_throttle drain no_instruction math_pipe_throttle mio_throttle not_selected selected dispatch_stall imc_miss branch_resolving sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
s ncu; timeout -k 5 400 ncu --profile-from-start off -k regex:'_attn_res|_gemv_up|_gemv_down|_kda_prep|_kda_recur|_gemv_kernel' --launch-count 48 --csv --metrics $M python3 benchmarks/ncu_decode.py > $OUT/ncu.csv 2> $OUT/ncu.err
echo "rc=$?"; tail -3 $OUT/ncu.err; grep -c '"' $OUT/ncu.csv
python3 benchmarks/ncu_table.py $OUT/ncu.csv | tee $OUT/ncu_table.txt | head -60
s done
