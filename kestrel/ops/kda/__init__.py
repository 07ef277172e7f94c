"""KDA ops, dispatched by device: Triton kernels on CUDA, the plain-torch reference elsewhere."""

from kestrel.ops import kernel
from kestrel.ops.kda import reference
from kestrel.ops.kda.reference import causal_conv1d, kda_gate, kda_step, l2norm, state_dtype_for  # noqa: F401
from kestrel.ops.kda.reference import kda_chunked_factored as chunked_factored  # noqa: F401
# speculative verify / ReplaySSM fold: plain torch on every device for now (no fused kernel yet)
from kestrel.ops.kda.reference import KDAReplay, kda_fold as fold, kda_verify as verify  # noqa: F401


def chunked(q, k, v, g, beta, **kw):
    """See reference.kda_chunked."""
    fn = kernel(__name__ + ".triton", "kda_chunked", q) or reference.kda_chunked
    return fn(q, k, v, g, beta, **kw)


def decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale):
    """One decode token per sequence: conv tail update, SiLU, L2 norm, gates, recurrence; in place on the slots.

    mixed [B, 3HK] (q, k, v projections); conv_weight [3HK, W]; conv_state [S, W - 1, 3HK]; ssm [S, H, K, V];
    slots [B]; raw_gate [B, H, K] (gate bottleneck output); beta [B, H]. Returns o [B, H, V] in v's dtype.
    """
    fn = kernel(__name__ + ".triton", "kda_decode", mixed) or reference.kda_decode
    return fn(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale)
