"""Attention-residual aggregation, dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.attn_res import reference


def attn_res(values, w, eps: float):
    """See reference.attn_res."""
    fn = kernel(__name__ + ".triton", "attn_res", values[0]) or reference.attn_res
    return fn(values, w, eps)


def attn_res_norm(values, w, eps: float, norm_weight, norm_eps: float):
    """See reference.attn_res_norm (one kernel on GPU)."""
    fn = kernel(__name__ + ".triton", "attn_res_norm", values[0]) or reference.attn_res_norm
    return fn(values, w, eps, norm_weight, norm_eps)


def attn_res_settle(bank, partial, delta, key_norm, key_proj, eps: float, norm_weight, norm_eps: float):
    """See reference.attn_res_settle (one kernel on GPU)."""
    x = partial if partial is not None else delta
    fn = kernel(__name__ + ".triton", "attn_res_settle", x) or reference.attn_res_settle
    return fn(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps)
