"""MoE ops (router, routed experts), dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.moe import reference
from kestrel.ops.moe.reference import Activation  # noqa: F401
from kestrel.ops.moe.reference import moe_experts_dense as experts_dense  # noqa: F401


DENSE_MAX_PAIRS = 32


def route(logits, correction_bias, top_k, renormalize, scaling, num_expert_group=1, topk_group=1):
    """See reference.route."""
    fn = kernel(__name__ + ".triton", "route", logits) or reference.route
    return fn(logits, correction_bias, top_k, renormalize, scaling, num_expert_group, topk_group)


# off: the expert kernels always wait before reading the routing (the decode ladder's "before" stage)
EARLY_IDS = True


def experts(x, experts_weights, weights, ids, act, ids_ready: bool = False, late_trigger: bool = False):
    """sum_k weights[t, k] * expert_{ids[t, k]}(x_t) for an ExpertWeights module (dense or MXFP4).

    ids_ready (GPU, programmatic dependent launch): the caller guarantees that the kernels which wrote `ids` and
    `weights` have finished by the time the expert kernels can start (a late-trigger launch sits between: see
    kestrel.ops.linear.linear), so the kernels read them, and stream the chosen experts' weights, before waiting
    for x. late_trigger: the last kernel lets its dependents launch only after its own wait (see
    kestrel.ops.linear.linear)."""
    fn = kernel(__name__ + ".triton", "moe_experts", x)
    if fn is not None:
        return fn(x, experts_weights, weights, ids, act, ids_ready and EARLY_IDS, late_trigger)
    e = experts_weights
    w1, w2, w3 = e.dense("w1", x.dtype), e.dense("w2", x.dtype), e.dense("w3", x.dtype)
    # CPU, interleaved timings on k3-small's 8 experts, top-2 (us, dense / loop / grouped): 1 token 425 / 535 / 387,
    # 4 tokens 630 / 1397 / 722, 8: 750 / 1456 / 673, 64: 2903 / 3291 / 1712, 128: 7418 / 3549 / 1719. So every
    # expert on every token (three batched products) only for 2 to 4 tokens; the expert-sorted form otherwise.
    T = x.shape[0]
    if 1 < T and T * w1.shape[0] <= DENSE_MAX_PAIRS:
        return reference.moe_experts_dense(x, w1, w2, w3, weights, ids, act)
    return reference.moe_experts_grouped(x, w1, w2, w3, weights, ids, act)


def activate(act, a, b):
    """act(a, b) (SiTU or SwiGLU) in one kernel on GPU; see reference.Activation."""
    fn = kernel(__name__ + ".triton", "activate", a)
    return fn(act, a, b) if fn is not None else act(a, b)
