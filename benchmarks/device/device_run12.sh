#!/bin/bash
# (PDL became the default after this ran: the flags here are the current spelling of what ran then)
# Call 2: the whole GPU suite in 8 pytest-xdist workers (the serial suite needs more than 250 s: most of it is
# Triton compilation, one test alone sat 60 s compiling inside a speculative engine's warm-up), PDL off then on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
s() { echo "== $1 ($(date +%T))"; }
for p in --disable-pdl ""; do
  s "suite $p"; timeout -k 5 270 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short --durations=8 tests/gpu $p > $OUT/t_gpu$p.log 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^[0-9.]+s (call|setup)" $OUT/t_gpu$p.log | head -24
done
s done
