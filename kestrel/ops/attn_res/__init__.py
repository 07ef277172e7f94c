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


class Settle:
    """A settle handed to the kernel that produces delta, to run as that kernel's epilogue (on the GPU one-row
    GEMV: kestrel.ops.linear.triton). The producer passes its output as delta; where a kernel took it, `result`
    holds (new partial sum, normed input), else it stays None and the caller settles as before. `sync` is the
    call site's int32 counter (zero between launches)."""

    def __init__(self, bank, partial, key_norm, key_proj, eps: float, norm_weight, norm_eps: float, sync):
        self.bank, self.partial = bank, partial
        self.key_norm, self.key_proj, self.eps = key_norm, key_proj, eps
        self.norm_weight, self.norm_eps, self.sync = norm_weight, norm_eps, sync
        self.result = None


# off: every settle is a launch of its own (the decode ladder's stage before the settle epilogue)
FUSE_SETTLE = True
