"""MoE ops (router, routed experts), dispatched by device."""

import torch

from kestrel.ops import kernel
from kestrel.ops.moe import reference
from kestrel.ops.moe.reference import Activation, Routing  # noqa: F401
from kestrel.ops.moe.reference import moe_experts_dense as experts_dense  # noqa: F401


DENSE_MAX_PAIRS = 32
# up to this many (token, expert) pairs the CPU takes the padded batched form (reference.moe_experts_padded).
# Interleaved timings on k3-small's experts (8 of width 192 over 128, top-2, 2 threads), padded against grouped:
# 5 / 8 / 16 tokens 1.40x / 1.63x / 1.85x, 64 tokens 1.25x, 128 tokens 1.04x, 2048 tokens 0.90x
PADDED_MAX_PAIRS = 256


def route(logits, correction_bias, top_k, renormalize, scaling, num_expert_group=1, topk_group=1):
    """See reference.route."""
    fn = kernel(__name__ + ".triton", "route", logits) or reference.route
    return fn(logits, correction_bias, top_k, renormalize, scaling, num_expert_group, topk_group)


# off: the expert kernels always wait before reading the routing (the decode ladder's "before" stage)
EARLY_IDS = True


# on: a latent MoE whose shared experts run in line hands their act(gate, up) to the routed experts' up GEMV
# (shared= below), which computes it once for the paired tail GEMV instead of every program of that GEMV
# recomputing the whole row in its prologue (~half its instructions after its wait at k3-mini's shapes, offline
# sm_90 SASS); bit-equal either way
SHARED_ACT_IN_EXPERTS = False


def experts(x, experts_weights, weights, ids, act, ids_ready: bool = False, late_trigger: bool = False,
            shared=None):
    """sum_k weights[t, k] * expert_{ids[t, k]}(x_t) for an ExpertWeights module (dense or MXFP4).

    ids_ready (GPU, programmatic dependent launch): the caller guarantees that the kernels which wrote `ids` and
    `weights` have finished by the time the expert kernels can start (a late-trigger launch sits between: see
    kestrel.ops.linear.linear), so the kernels read them, and stream the chosen experts' weights, before waiting
    for x. late_trigger: the last kernel lets its dependents launch only after its own wait (see
    kestrel.ops.linear.linear). shared: (gate, up) of another gated MLP with the same activation; then returns
    (output, its down projection's input act(gate, up) where the expert kernels computed it, else None)."""
    fn = kernel(__name__ + ".triton", "moe_experts", x)
    if fn is not None:
        return fn(x, experts_weights, weights, ids, act, ids_ready and EARLY_IDS, late_trigger, shared=shared)
    y = _experts_reference(x, experts_weights, weights, ids, act)
    return (y, None) if shared is not None else y


def _experts_reference(x, experts_weights, weights, ids, act):
    e = experts_weights
    w1, w2, w3 = e.dense("w1", x.dtype), e.dense("w2", x.dtype), e.dense("w3", x.dtype)
    # CPU, interleaved timings on k3-small's 8 experts, top-2 (us, dense / loop / grouped): 1 token 425 / 535 / 387,
    # 4 tokens 630 / 1397 / 722, 8: 750 / 1456 / 673, 64: 2903 / 3291 / 1712, 128: 7418 / 3549 / 1719. So every
    # expert on every token (three batched products) only for 2 to 4 tokens; then the padded form up to
    # PADDED_MAX_PAIRS pairs (unless the routing is too skewed for it), the expert-sorted form otherwise.
    T = x.shape[0]
    if 1 < T and T * w1.shape[0] <= DENSE_MAX_PAIRS:
        return reference.moe_experts_dense(x, w1, w2, w3, weights, ids, act)
    if 1 < T and ids.numel() <= PADDED_MAX_PAIRS:  # (one token: the grouped form, 578 against 607 us)
        y = reference.moe_experts_padded(x, w1, w2, w3, weights, ids, act)
        if y is not None:
            return y
    return reference.moe_experts_grouped(x, w1, w2, w3, weights, ids, act)


# off: routing is its own launch before the expert kernels (the decode ladder's "before" stage)
ROUTE_IN_EXPERTS = True


def routes_in_experts(logits, routing: Routing) -> bool:
    """Whether experts_routed chooses the experts inside the expert kernels for these logits (GPU, small batches).
    When it does not, a caller that wants the expert kernels to read the routing before their wait (ids_ready)
    must route first, before the kernel that launches them late."""
    fn = kernel(__name__ + ".triton", "routes_in_kernel", logits)
    return ROUTE_IN_EXPERTS and fn is not None and fn(logits, routing)


def experts_routed(x, experts_weights, logits, routing: Routing, act, ids_ready: bool = False,
                   late_trigger: bool = False, shared=None):
    """experts(x, experts_weights, *route(logits, ...routing), act): on GPU the small-batch expert kernels choose
    the experts from the logits themselves (one launch fewer). ids_ready: as for experts, about the logits (and it
    holds only where routes_in_experts: a routing launched here runs after the caller's late-trigger kernel).
    shared: as for experts."""
    if routes_in_experts(logits, routing):
        fn = kernel(__name__ + ".triton", "moe_experts_routed", x)
        return fn(x, experts_weights, logits, routing, act, ids_ready and EARLY_IDS, late_trigger, shared=shared)
    weights, ids = route(logits, routing.correction_bias, routing.top_k, routing.renormalize, routing.scaling,
                         routing.num_expert_group, routing.topk_group)
    return experts(x, experts_weights, weights, ids, act, False, late_trigger, shared=shared)


# off: the shared experts run in line, on the routed experts' stream after them (the decode ladder runs them so)
SHARED_STREAM = True
# ... for batches of this many tokens: at one token the shared experts in line (their down projection paired with
# the routed up projection in one GEMV) measured faster, and the second stream lost from 256 tokens and on
# prefills. k3-mini decode graph, H200, PDL, back to back, stream vs in line: 0.893x at batch 1, 0.993-1.001x at
# 2-3, 1.038x at 4, 1.080x at 8, 1.026x at 16, 1.006-1.013x at 32-128, 0.979x at 256; eager prefills of 512 and
# 4096 tokens 0.904x and 0.942x (docs/kernels.md, session of 2026-12-03 07:05)
SHARED_STREAM_MIN_TOKENS = 4
SHARED_STREAM_MAX_TOKENS = 128
_side_streams: dict = {}


def side_stream(x: torch.Tensor):
    """The second CUDA stream the MoE runs its shared experts on, beside the routed experts (inference on CUDA;
    None elsewhere, where the two run one after the other). The routed path is a chain of latency-bound launches
    (router, latent down projection, the expert GEMVs, whose weights stream only once the routing is known); the
    shared experts need only the MoE's input, so their weights stream while that chain runs. One stream per
    device, reused by every layer: each layer forks from the main stream and joins it again (inside a CUDA graph
    capture too, where the fork and the join become the graph's edges)."""
    if (not SHARED_STREAM or x.device.type != "cuda" or torch.is_grad_enabled()
            or not SHARED_STREAM_MIN_TOKENS * x.shape[-1] <= x.numel() <= SHARED_STREAM_MAX_TOKENS * x.shape[-1]):
        return None
    s = _side_streams.get(x.device)
    if s is None:
        s = _side_streams[x.device] = torch.cuda.Stream(x.device)
    return s


def activate(act, a, b):
    """act(a, b) (SiTU or SwiGLU) in one kernel on GPU; see reference.Activation."""
    fn = kernel(__name__ + ".triton", "activate", a)
    return fn(act, a, b) if fn is not None else act(a, b)
