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


def attn_res_settle(bank, partial, delta, key_norm, key_proj, eps: float, norm_weight, norm_eps: float,
                    early: bool = False):
    """See reference.attn_res_settle (one kernel on GPU). early (programmatic dependent launch): the caller
    guarantees that every kernel before the one that wrote `delta` has finished when this kernel can start (delta's
    producer launched its dependents only after its own wait, or launched plainly), so the bank and the partial
    sum are read, and their logits formed, before the kernel waits for delta."""
    x = partial if partial is not None else delta
    fn = kernel(__name__ + ".triton", "attn_res_settle", x)
    if fn is None:
        return reference.attn_res_settle(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps)
    return fn(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, early and EARLY_SETTLE)


# off: the settle waits before reading anything (the decode ladder's "before" stage)
EARLY_SETTLE = True
