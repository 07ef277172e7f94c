"""Triton attention-residual aggregation: one program per token. The values are loaded into one [N, D] tile up
front (independent loads the compiler can issue together, not N dependent round trips), then the logits, the
softmax and the weighted sum are tile reductions. The settle form also forms the partial sum P + delta in the
kernel (and writes it back), folds the site vector from its two weights, and applies the next sublayer's RMSNorm.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl_args


@triton.jit
def _attn_res_kernel(bank, p_ptr, d_ptr, pout_ptr, w_ptr, w2_ptr, out_ptr, nw_ptr, norm_ptr, D, eps, norm_eps,
                     NB: tl.constexpr, HAS_P: tl.constexpr, HAS_D: tl.constexpr, HAS_W2: tl.constexpr,
                     HAS_OUT: tl.constexpr, HAS_NORM: tl.constexpr, NPAD: tl.constexpr, BLOCK: tl.constexpr,
                     EARLY: tl.constexpr, PDL: tl.constexpr):
    """EARLY (every kernel before the one that wrote delta has finished when this one starts: see
    attn_res_settle): the bank, the partial sum and their logits before waiting, only delta after."""
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    # every vector is a [1, BLOCK] row in the [NPAD, BLOCK] tile's layout: the values go into the tile and the
    # aggregate comes out of it with no layout conversion. With 1-D vectors each value in and the aggregate out was a
    # round trip through shared memory (3 after the wait, 1 more a bank value), and a settle of 6 bank values added
    # 3.98 us to a GEMV chain's link against 1.97 this way (benchmarks/settle_chain.py, docs/kernels.md 2026-12-07)
    offs = tl.arange(0, BLOCK)[None, :]
    mask = offs < D
    idx = tl.arange(0, NPAD)[:, None]
    tile = tl.zeros([NPAD, BLOCK], tl.float32)
    for i in tl.static_range(NB):
        tile = tl.where(idx == i, tl.load(bank[i] + row * D + offs, mask=mask, other=0.0).to(tl.float32), tile)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    if HAS_W2:  # the site vector norm_weight * proj_weight, rounded to the weights' dtype as torch would
        w = (w.to(tl.float32) * tl.load(w2_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(w_ptr.dtype.element_ty)
    w = w.to(tl.float32)
    # logit_i = <RMSNorm(v_i), w>: the row's rsqrt factors out of the dot product (the bank's rows first)
    logit = tl.sum(tile * w, 1, keep_dims=True) / tl.sqrt(tl.sum(tile * tile, 1, keep_dims=True) / D + eps)
    # the last value: the partial sum, with the pending sublayer output added in the stream's dtype (torch's add)
    if HAS_P:
        x = tl.load(p_ptr + row * D + offs, mask=mask, other=0.0)
        if EARLY and PDL:
            gdc_wait()
        if HAS_D:
            x = (x.to(tl.float32) + tl.load(d_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32))
            x = x.to(pout_ptr.dtype.element_ty)
            tl.store(pout_ptr + row * D + offs, x, mask=mask)
    else:
        if EARLY and PDL:
            gdc_wait()
        x = tl.load(d_ptr + row * D + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    tile = tl.where(idx == NB, xf, tile)
    lx = tl.sum(xf * w, 1, keep_dims=True) / tl.sqrt(tl.sum(xf * xf, 1, keep_dims=True) / D + eps)  # [1, 1]
    logit = tl.where(idx == NB, lx, tl.where(idx < NB, logit, -float("inf")))  # [NPAD, 1]
    p = tl.exp(logit - tl.max(logit, 0, keep_dims=True))
    y = tl.sum(tile * p, 0, keep_dims=True) / tl.sum(p, 0, keep_dims=True)
    y_out = y.to(pout_ptr.dtype.element_ty)  # the aggregate in the stream's dtype (the norm reads it rounded)
    if HAS_OUT:
        tl.store(out_ptr + row * D + offs, y_out, mask=mask)
    if HAS_NORM:
        yf = y_out.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(yf * yf, 1, keep_dims=True) / D + norm_eps)
        z = (yf * r).to(y_out.dtype).to(tl.float32) * tl.load(nw_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(norm_ptr + row * D + offs, z.to(norm_ptr.dtype.element_ty), mask=mask)


# warps per program (None: one per 256 columns, at most 16); the decode ladder's --tile-sweep times others
WARPS = None


def _launch(bank, partial, delta, w, w2, eps, norm_weight, norm_eps, want_out: bool, early: bool = False):
    """Aggregate bank + [partial (+ delta)]; returns (aggregate or None, normed or None, new partial)."""
    x0 = partial if partial is not None else delta
    shape, D = x0.shape, x0.shape[-1]
    flat = lambda t: t.reshape(-1, D).contiguous()  # noqa: E731
    vals = tuple(flat(v) for v in bank)
    p = flat(partial) if partial is not None else None
    d = flat(delta) if delta is not None else None
    T = (p if p is not None else d).shape[0]
    new_p = torch.empty_like(p) if p is not None and d is not None else (p if p is not None else d)
    out = torch.empty_like(new_p) if want_out else None
    norm = None
    if norm_weight is not None:
        norm = torch.empty(new_p.shape, dtype=torch.promote_types(norm_weight.dtype, x0.dtype), device=x0.device)
    BLOCK = triton.next_power_of_2(D)
    if T:
        _attn_res_kernel[(T,)](vals, p if p is not None else d, d if d is not None else new_p, new_p, w,
                               w2 if w2 is not None else w, out if out is not None else new_p,
                               norm_weight if norm_weight is not None else w, norm if norm is not None else new_p,
                               D, eps, norm_eps or 0.0, NB=len(vals), HAS_P=p is not None,
                               HAS_D=p is not None and d is not None, HAS_W2=w2 is not None, HAS_OUT=want_out,
                               HAS_NORM=norm_weight is not None, NPAD=triton.next_power_of_2(len(vals) + 1),
                               BLOCK=BLOCK, EARLY=early, num_warps=WARPS or max(1, min(16, BLOCK // 256)),
                               **pdl_args(x0))
    view = lambda t: None if t is None else t.view(shape)  # noqa: E731
    return view(out), view(norm), view(new_p)


def attn_res(values: list[torch.Tensor], w: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.attn_res."""
    if values[0].dtype == torch.float64:
        from kestrel.ops.attn_res.reference import attn_res as ref
        return ref(values, w, eps)
    return _launch(values[:-1], values[-1], None, w, None, eps, None, None, True)[0]


def attn_res_norm(values, w, eps: float, norm_weight, norm_eps: float):
    """See reference.attn_res_norm: the aggregate and its RMSNorm, one kernel."""
    if values[0].dtype == torch.float64:
        from kestrel.ops.attn_res.reference import attn_res_norm as ref
        return ref(values, w, eps, norm_weight, norm_eps)
    return _launch(values[:-1], values[-1], None, w, None, eps, norm_weight, norm_eps, True)[:2]


def attn_res_settle(bank, partial, delta, key_norm, key_proj, eps: float, norm_weight, norm_eps: float,
                    early: bool = False):
    """See reference.attn_res_settle: P + delta, the aggregate and the next RMSNorm in one kernel."""
    if (partial if partial is not None else delta).dtype == torch.float64:
        from kestrel.ops.attn_res.reference import attn_res_settle as ref
        return ref(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps)
    _, normed, new_p = _launch(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, False, early)
    return new_p, normed
