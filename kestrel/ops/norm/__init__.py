"""RMSNorm ops, dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.norm import reference


def rms_norm(x, weight, eps: float):
    fn = kernel(__name__ + ".triton", "rms_norm", x) or reference.rms_norm
    return fn(x, weight, eps)


def gated_rms_norm(x, gate, weight, eps: float):
    fn = kernel(__name__ + ".triton", "gated_rms_norm", x) or reference.gated_rms_norm
    return fn(x, gate, weight, eps)


def embed_rms_norm(ids, table, weight, eps: float):
    """(table[ids], rms_norm(table[ids])) in one kernel on GPU."""
    fn = kernel(__name__ + ".triton", "embed_rms_norm", table) or reference.embed_rms_norm
    return fn(ids, table, weight, eps)


def add_rms_norm(x, residual, weight, eps: float):
    """(x + residual, rms_norm(x + residual)) in one pass on GPU."""
    fn = kernel(__name__ + ".triton", "add_rms_norm", x) or reference.add_rms_norm
    return fn(x, residual, weight, eps)
