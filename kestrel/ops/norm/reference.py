"""RMSNorm variants, computed in at least fp32 as Moonshot's and transformers' code does."""

import torch

from kestrel.ops.kda.reference import state_dtype_for


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps), cast back to x's dtype, then scaled by weight (None: no weight)."""
    xf = x.to(state_dtype_for(x.dtype))
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else weight * y


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head output norm of KDA: RMSNorm(x) * w * sigmoid(gate), all in fp32, cast at the end."""
    dt = state_dtype_for(x.dtype)
    xf = x.to(dt)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(dt)
    return (y * torch.sigmoid(gate.to(dt))).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(s, rms_norm(s, weight, eps)) with s = x + residual: the residual add fused with the next pre-norm."""
    s = x + residual
    return s, rms_norm(s, weight, eps)
