"""Summarise `ncu --csv --metrics ...` output (benchmarks/ncu_decode.py): one line per profiled kernel with its
duration, DRAM throughput, achieved occupancy, registers, grid and the largest warp-stall reasons.

  python3 benchmarks/ncu_table.py ncu.csv
"""

import csv
import sys
from collections import OrderedDict

STALL = "smsp__average_warps_issue_stalled_"
# microseconds per unit of ncu's duration, whichever it chose
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def main(path: str) -> None:
    rows: OrderedDict = OrderedDict()
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        key = (r["ID"], r["Kernel Name"][:28])
        v = r["Metric Value"].replace(",", "")
        if r["Metric Name"] == "gpu__time_duration.sum":
            v = str(float(v) * TO_US.get(r["Metric Unit"], float("nan")))
        rows.setdefault(key, {})[r["Metric Name"]] = v
    print(f"{'id':>4} {'kernel':<28} {'us':>7} {'dram%':>6} {'occ%':>5} {'regs':>4} {'grid':>6}  "
          "stalls (cycles per issue)")
    for (kid, name), m in rows.items():
        stalls = sorted(((float(v), k[len(STALL):].replace("_per_issue_active.ratio", ""))
                         for k, v in m.items() if k.startswith(STALL)), reverse=True)[:4]
        dur = float(m.get("gpu__time_duration.sum", "nan"))
        dram = float(m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", "nan"))
        occ = float(m.get("sm__warps_active.avg.pct_of_peak_sustained_active", "nan"))
        print(f"{kid:>4} {name:<28} {dur:7.2f} {dram:6.1f} {occ:5.1f} "
              f"{m.get('launch__registers_per_thread', '?'):>4} {m.get('launch__grid_size', '?'):>6}  "
              + ", ".join(f"{n} {v:.1f}" for v, n in stalls))


if __name__ == "__main__":
    main(sys.argv[1])
