"""Attention-residual aggregation, dispatched by device."""

import torch

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


# the MoE router's logits inside the settle before it (GPU, batches of up to this many tokens; 0: off): each row's
# settle runs in cdiv(E, values) programs that each form a slice of the logits, so the router needs no GEMV launch of
# its own on the decode chain (each program repeats the row's settle: a cost that grows with the tokens)
ROUTER_IN_SETTLE_MAX_TOKENS = 0


def attn_res_settle_router(bank, partial, delta, key_norm, key_proj, eps: float, norm_weight, norm_eps: float,
                           router_weight, early: bool = False):
    """attn_res_settle and, on GPU for a few tokens (ROUTER_IN_SETTLE_MAX_TOKENS), in the same kernel the router's
    logits of the normed rows, linear(normed, router_weight) (fp32 [T, E] for an fp32 [E, D] weight; they differ from
    the router GEMV's by fp32 summation order only): (partial, normed, logits or None where they were not formed,
    for the caller's router to form)."""
    x = partial if partial is not None else delta
    fn = kernel(__name__ + ".triton", "attn_res_settle_router", x)
    if (fn is not None and x.numel() <= ROUTER_IN_SETTLE_MAX_TOKENS * x.shape[-1] and x.dtype != torch.float64
            and router_weight.dtype == torch.float32 and router_weight.is_contiguous()):
        return fn(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, router_weight,
                  early and EARLY_SETTLE)
    return (*attn_res_settle(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, early), None)
