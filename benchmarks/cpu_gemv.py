"""One-row CPU products x @ W^T: the row-major weight [N, K] (F.linear, what a Linear holds) against a K-major copy
[K, N] (what `kestrel.ops.linear.KMajorGemv` multiplies by), with the weight in cache (warm) and evicted by a 64 MB
sweep before every call (cold: a forward whose weights exceed the last-level cache, as k3-small's do).

    OMP_NUM_THREADS=1 python benchmarks/cpu_gemv.py [--shapes 4096x256,1024x256,256x256] [--rows 1,8] [--calls 40]

Prints the median microseconds of each side and their ratio; both sides run in this one process, turn about.
"""

import argparse
import time

import torch
import torch.nn.functional as F


def median_us(fn, calls: int, sweep: torch.Tensor | None) -> float:
    times = []
    for _ in range(calls):
        if sweep is not None:
            sweep.add_(1.0)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x256,1024x256,512x256,256x256")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sweep = torch.zeros(16 << 20)  # 64 MB, twice this machine's last-level cache
    print(f"{'weight':>10s} {'rows':>4s} | {'cold row-major':>14s} {'cold K-major':>12s} {'ratio':>6s} | "
          f"{'warm row-major':>14s} {'warm K-major':>12s} {'ratio':>6s}")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w = torch.randn(n, k)
        w_k = w.t().contiguous()
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k)
            row = lambda: F.linear(x, w)  # noqa: E731
            kmaj = lambda: x @ w_k  # noqa: E731
            for fn in (row, kmaj):
                median_us(fn, 5, None)
            figures = []
            for cold in (True, False):
                a = median_us(row, args.calls, sweep if cold else None)
                b = median_us(kmaj, args.calls, sweep if cold else None)
                figures += [a, b, a / b]
            print(f"{shape:>10s} {m:4d} | {figures[0]:14.0f} {figures[1]:12.0f} {figures[2]:5.2f}x | "
                  f"{figures[3]:14.0f} {figures[4]:12.0f} {figures[5]:5.2f}x")


if __name__ == "__main__":
    main()
