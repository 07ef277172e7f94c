"""MoE ops (router, routed experts), dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.moe import reference
from kestrel.ops.moe.reference import Activation  # noqa: F401
from kestrel.ops.moe.reference import moe_experts_dense as experts_dense  # noqa: F401


def route(logits, correction_bias, top_k, renormalize, scaling, num_expert_group=1, topk_group=1):
    """See reference.route."""
    fn = kernel(__name__ + ".triton", "route", logits) or reference.route
    return fn(logits, correction_bias, top_k, renormalize, scaling, num_expert_group, topk_group)


def experts(x, experts_weights, weights, ids, act):
    """sum_k weights[t, k] * expert_{ids[t, k]}(x_t) for an ExpertWeights module (dense or MXFP4)."""
    fn = kernel(__name__ + ".triton", "moe_experts", x)
    if fn is not None:
        return fn(x, experts_weights, weights, ids, act)
    e = experts_weights
    return reference.moe_experts(x, e.dense("w1", x.dtype), e.dense("w2", x.dtype), e.dense("w3", x.dtype), weights, ids, act)


def activate(act, a, b):
    """act(a, b) (SiTU or SwiGLU) in one kernel on GPU; see reference.Activation."""
    fn = kernel(__name__ + ".triton", "activate", a)
    return fn(act, a, b) if fn is not None else act(a, b)
