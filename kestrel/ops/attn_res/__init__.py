"""Attention-residual aggregation, dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.attn_res import reference


def attn_res(values, w, eps: float):
    """See reference.attn_res."""
    fn = kernel(__name__ + ".triton", "attn_res", values[0]) or reference.attn_res
    return fn(values, w, eps)
