"""One-row against eight-row linear layers on this CPU, through the GEMM paths torch offers: why an 8-token
speculative verify costs several plain decode steps here (issue 8). Hot-loop medians in microseconds.

    OMP_NUM_THREADS=1 python benchmarks/cpu_gemm.py
"""

import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import hot_loop_us  # noqa: E402

SHAPES = [(256, 256), (4096, 256), (768, 256), (256, 768)]  # (out, in): k3-small's projections and its LM head


def timed(fn, n: int = 200) -> float:
    return statistics.median(hot_loop_us(fn, n))


def main() -> None:
    torch.set_num_threads(1)
    print("| out x in | rows | F.linear (MKL) | x @ W^T stored transposed | oneDNN, packed weight | MKL, packed weight |")
    print("|---|---|---|---|---|---|")
    for N, K in SHAPES:
        W = torch.randn(N, K)
        Wt = W.t().contiguous()
        for M in (1, 8):
            x = torch.randn(M, K)
            ref = F.linear(x, W)
            dnn = torch.ops.mkldnn._reorder_linear_weight(W, M)
            mkl = torch.ops.mkl._mkl_reorder_linear_weight(W, M)
            paths = [lambda: F.linear(x, W), lambda: x @ Wt,
                     lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], ""),
                     lambda: torch.ops.mkl._mkl_linear(x, mkl, W, None, M)]
            for fn in paths:
                torch.testing.assert_close(fn(), ref, rtol=1e-4, atol=1e-4)
            print(f"| {N} x {K} | {M} | " + " | ".join(f"{timed(fn):.1f}" for fn in paths) + " |")


if __name__ == "__main__":
    main()
