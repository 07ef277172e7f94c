"""Triton attention-residual aggregation: one program per token, one pass over the values (online softmax),
optionally followed by the next sublayer's RMSNorm in the same kernel."""

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_res_kernel(vals, w_ptr, nw_ptr, out_ptr, norm_ptr, D, eps, norm_eps,
                     N: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = -float("inf")
    s = 0.0
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(N):
        v = tl.load(vals[i] + row * D + offs, mask=mask, other=0.0).to(tl.float32)
        # logit = <RMSNorm(v), w>: the row's rsqrt factors out of the dot product
        logit = tl.sum(v * w, 0) / tl.sqrt(tl.sum(v * v, 0) / D + eps)
        m_new = tl.maximum(m, logit)
        alpha = tl.exp(m - m_new)
        p = tl.exp(logit - m_new)
        s = s * alpha + p
        acc = acc * alpha + p * v
        m = m_new
    y = acc / s
    y_out = y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * D + offs, y_out, mask=mask)
    if HAS_NORM:
        yf = y_out.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(yf * yf, 0) / D + norm_eps)
        z = (yf * r).to(out_ptr.dtype.element_ty).to(tl.float32) * tl.load(nw_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(norm_ptr + row * D + offs, z.to(norm_ptr.dtype.element_ty), mask=mask)


def _launch(values, w, eps, norm_weight, norm_eps):
    v0 = values[0]
    D = v0.shape[-1]
    vals = tuple(v.reshape(-1, D).contiguous() for v in values)
    T = vals[0].shape[0]
    out = torch.empty_like(vals[0])
    norm = None
    if norm_weight is not None:
        norm = torch.empty(out.shape, dtype=torch.promote_types(norm_weight.dtype, v0.dtype), device=v0.device)
    BLOCK = triton.next_power_of_2(D)
    if T:
        _attn_res_kernel[(T,)](vals, w, norm_weight if norm_weight is not None else w, out,
                               norm if norm is not None else out, D, eps, norm_eps or 0.0,
                               N=len(vals), HAS_NORM=norm_weight is not None, BLOCK=BLOCK,
                               num_warps=max(1, min(16, BLOCK // 256)))
    return out.view(v0.shape), (None if norm is None else norm.view(v0.shape))


def attn_res(values: list[torch.Tensor], w: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.attn_res."""
    if values[0].dtype == torch.float64:
        from kestrel.ops.attn_res.reference import attn_res as ref
        return ref(values, w, eps)
    return _launch(values, w, eps, None, None)[0]


def attn_res_norm(values, w, eps: float, norm_weight, norm_eps: float):
    """See reference.attn_res_norm: the aggregate and its RMSNorm, one kernel."""
    if values[0].dtype == torch.float64:
        from kestrel.ops.attn_res.reference import attn_res_norm as ref
        return ref(values, w, eps, norm_weight, norm_eps)
    return _launch(values, w, eps, norm_weight, norm_eps)
