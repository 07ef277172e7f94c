"""Triton GEMV for decode-sized batches (M <= 4): each program streams BN full weight rows in BK-wide, 16-byte
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


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M <= 4, K] @ weight[N, K]^T -> [M, N] in x's dtype (fp32 accumulation)."""
    M, K = x.shape
    N = weight.shape[0]
    assert M <= 4 and weight.is_contiguous()
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BN = 8 if N >= 1024 else 4
    BK = min(512, triton.next_power_of_2(K))
    if M:
        _gemv_kernel[(triton.cdiv(N, BN),)](x, weight, y, M, N, K=K, BM=triton.next_power_of_2(M), BN=BN, BK=BK,
                                           num_warps=4, num_stages=1)
    return y
