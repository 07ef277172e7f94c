"""Triton GEMV for decode-sized batches (M <= 8): each program streams BN full weight rows in BK-wide, 16-byte
loads and keeps the M input rows in registers; no tensor cores (the work is pure weight bandwidth)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    nb = tl.program_id(0)
    rows = nb * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.static_range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                    mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0).to(tl.float32)
        for m in tl.static_range(BM):
            xm = tl.load(x_ptr + m * K + cols, mask=(cols < K) & (m < M), other=0.0).to(tl.float32)
            part = tl.sum(w * xm[None, :], 1)
            acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    tl.store(y_ptr + rm[:, None] * N + rows[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rows[None, :] < N))


# (rows per program, K per step) override for benchmarks/kernels.py's tile sweep; None = the rule below
TILE = None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M <= 8, K] @ weight[N, K]^T -> [M, N] in the wider dtype of the two (fp32 accumulation)."""
    M, K = x.shape
    N = weight.shape[0]
    assert M <= 8 and weight.is_contiguous()
    x = x.contiguous()
    y = torch.empty(M, N, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    BN, BK = TILE or (8 if N > 4096 else 4, 512)
    BK = min(BK, triton.next_power_of_2(K))
    if M:
        _gemv_kernel[(triton.cdiv(N, BN),)](x, weight, y, M, N, K=K, BM=triton.next_power_of_2(M), BN=BN, BK=BK,
                                           num_warps=4, num_stages=1)
    return y
