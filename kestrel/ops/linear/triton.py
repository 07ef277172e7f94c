"""Triton GEMV for decode-sized batches (M <= 8): each program streams BN full weight rows in 16-byte loads and
keeps the M input rows in registers; no tensor cores (the work is pure weight bandwidth).

A program whose weight tile fits PREFETCH_MAX loads it whole, larger ones stream it BK columns at a time. Under
programmatic dependent launch (ops.pdl) the whole tile is loaded before the program waits for the previous kernel,
so the weight stream overlaps that kernel: `weight` must not be written by kernels still in flight on the stream
(model parameters never are).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl


@triton.jit
def _dot_rows(acc, w, x_ptr, cols, M, K: tl.constexpr, BM: tl.constexpr):
    """acc[m, :] += w @ x[m, cols] for the M rows of x (w: [BN, cols] fp32)."""
    rm = tl.arange(0, BM)
    for m in tl.static_range(BM):
        xm = tl.load(x_ptr + m * K + cols, mask=(cols < K) & (m < M), other=0.0).to(tl.float32)
        part = tl.sum(w * xm[None, :], 1)
        acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, add_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, HAS_ADD: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    nb = tl.program_id(0)
    rows = nb * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    if PDL:
        gdc_launch_dependents()
    if PREFETCH:  # the whole [BN, K] tile in flight before the wait: only x depends on the previous kernel
        cols = tl.arange(0, PREFETCH)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                    mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0)
        if PDL:
            gdc_wait()
        acc = _dot_rows(acc, w.to(tl.float32), x_ptr, cols, M, K, BM)
    else:
        if PDL:
            gdc_wait()
        for k0 in tl.static_range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                        mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0).to(tl.float32)
            acc = _dot_rows(acc, w, x_ptr, cols, M, K, BM)
    out_mask = (rm[:, None] < M) & (rows[None, :] < N)
    y = acc.to(y_ptr.dtype.element_ty)
    if HAS_ADD:  # y + add as torch would compute it after the GEMV: rounded product, then the rounded sum
        r = tl.load(add_ptr + rm[:, None] * N + rows[None, :], mask=out_mask, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * N + rows[None, :], y, mask=out_mask)


# (rows per program, K per step) override for benchmarks/kernels.py's tile sweep; None = the rule below
TILE = None
# the largest weight tile (elements) a program loads whole (before it waits, under PDL); larger ones stream by BK
PREFETCH_MAX = 16384


def linear(x: torch.Tensor, weight: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """x [M <= 8, K] @ weight[N, K]^T (+ add [M, N], same dtype as the result) -> [M, N] in the wider dtype of
    the two (fp32 accumulation)."""
    M, K = x.shape
    N = weight.shape[0]
    assert M <= 8 and weight.is_contiguous()
    x = x.contiguous()
    y = torch.empty(M, N, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    BN, BK = TILE or (8 if N > 4096 else 4, 512)
    BK = min(BK, triton.next_power_of_2(K))
    use_pdl = pdl(x)
    KP = triton.next_power_of_2(K)
    prefetch = KP if TILE is None and BN * KP <= PREFETCH_MAX else 0
    if M:
        if add is not None:
            assert add.shape == y.shape and add.dtype == y.dtype
            add = add.contiguous()
        _gemv_kernel[(triton.cdiv(N, BN),)](x, weight, y, add if add is not None else y, M, N, K=K,
                                           BM=triton.next_power_of_2(M), BN=BN, BK=BK, HAS_ADD=add is not None,
                                           PDL=use_pdl, PREFETCH=prefetch, num_stages=1, launch_pdl=use_pdl,
                                           num_warps=8 if prefetch and BN * KP >= 16384 else 4)
    return y
