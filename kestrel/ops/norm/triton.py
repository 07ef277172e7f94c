"""Triton RMSNorm kernels: one program per row, the whole row in registers, fp32 math, reference roundings."""

import torch
import triton
import triton.language as tl

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue



def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


@triton.jit
def _normed(x, w_ptr, offs, mask, D, eps, HAS_W: tl.constexpr):
    """A row's RMSNorm in fp32 with the reference's roundings: the normalised row cast back to x's dtype, then the
    weight applied (HAS_W)."""
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / D + eps)
    y = (xf * r).to(x.dtype).to(tl.float32)
    if HAS_W:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0)
    y = _normed(x, w_ptr, offs, mask, D, eps, HAS_W)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """See reference.rms_norm (fp64 inputs go to the reference)."""
    if x.dtype == torch.float64:
        from kestrel.ops.norm.reference import rms_norm as ref
        return ref(x, weight, eps)
    rows = _rows(x)
    D = rows.shape[-1]
    out_dtype = x.dtype if weight is None else torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    BLOCK = triton.next_power_of_2(D)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight if weight is not None else rows, out, D, eps,
                                           HAS_W=weight is not None, BLOCK=BLOCK, num_warps=_warps(BLOCK),
                                           **pdl_args(rows))
    return out.view(*x.shape[:-1], D)


@triton.jit
def _embed_rms_norm_kernel(ids_ptr, table_ptr, w_ptr, e_ptr, out_ptr, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """_rms_norm_kernel of the table's row ids[row], that row also copied out."""
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(table_ptr + tl.load(ids_ptr + row).to(tl.int64) * D + offs, mask=mask, other=0.0)
    tl.store(e_ptr + row * D + offs, x, mask=mask)
    y = _normed(x, w_ptr, offs, mask, D, eps, True)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def embed_rms_norm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float):
    """See reference.embed_rms_norm: the first layer's input in one launch, where the lookup and the norm took two
    (the norm's roundings, so bit-equal to rms_norm of the lookup)."""
    if table.dtype == torch.float64 or not table.is_contiguous() or ids.dim() != 1:
        from kestrel.ops.norm.reference import embed_rms_norm as ref
        return ref(ids, table, weight, eps)
    T, D = ids.shape[0], table.shape[1]
    e = torch.empty(T, D, dtype=table.dtype, device=table.device)
    out = torch.empty(T, D, dtype=torch.promote_types(weight.dtype, table.dtype), device=table.device)
    BLOCK = triton.next_power_of_2(D)
    if T:
        _embed_rms_norm_kernel[(T,)](ids.contiguous(), table, weight, e, out, D, eps, BLOCK=BLOCK,
                                     num_warps=_warps(BLOCK), **pdl_args(table))
    return e, out


@triton.jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    xf = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / D + eps)
    y = xf * r * w * tl.sigmoid(g)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.gated_rms_norm."""
    if x.dtype == torch.float64:
        from kestrel.ops.norm.reference import gated_rms_norm as ref
        return ref(x, gate, weight, eps)
    rows, grows = _rows(x), _rows(gate)
    D = rows.shape[-1]
    out = torch.empty_like(rows)
    BLOCK = triton.next_power_of_2(D)
    if rows.shape[0]:
        _gated_rms_norm_kernel[(rows.shape[0],)](rows, grows, weight, out, D, eps, BLOCK=BLOCK,
                                                 num_warps=_warps(BLOCK), **pdl_args(rows))
    return out.view(x.shape)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0)
    s = (x.to(tl.float32) + tl.load(r_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + row * D + offs, s, mask=mask)
    y = _normed(s, w_ptr, offs, mask, D, eps, True)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(s, rms_norm(s)) with s = x + residual, in one pass: see reference.add_rms_norm."""
    rows, res = _rows(x), _rows(residual)
    D = rows.shape[-1]
    s = torch.empty_like(rows)
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    BLOCK = triton.next_power_of_2(D)
    if rows.shape[0]:
        _add_rms_norm_kernel[(rows.shape[0],)](rows, res, weight, s, out, D, eps, BLOCK=BLOCK,
                                               num_warps=_warps(BLOCK), **pdl_args(rows))
    return s.view(x.shape), out.view(x.shape)
