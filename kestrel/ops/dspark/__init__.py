"""The DSpark drafter's correction ops, dispatched by device (see reference.py)."""

from kestrel.ops import kernel
from kestrel.ops.dspark import reference
from kestrel.ops.dspark.reference import accept_lazy, decode, pack  # noqa: F401

# the most rows the kernels serve (one program per row and output tile; more rows go to cuBLAS and torch)
KERNEL_MAX_ROWS = 8


def _fast(name: str, x, rows: int):
    return kernel(__name__ + ".triton", name, x) if rows <= KERNEL_MAX_ROWS else None


def correct_up(slot, state, prev, emb, w_up, eps: float, early: bool = False):
    """early: see triton.correct_up (the kernel's launch order; the reference has none)."""
    fn = _fast("correct_up", slot, slot.shape[0])
    if fn is None:
        return reference.correct_up(slot, state, prev, emb, w_up, eps)
    return fn(slot, state, prev, emb, w_up, eps, early=early)


def head_keys(h, w, stats: bool = False, eps: float | None = None, late_trigger: bool = False):
    """late_trigger: see triton.head_keys."""
    fn = _fast("head_keys", h, h.shape[0])
    if fn is None:
        return reference.head_keys(h, w, stats, eps)
    return fn(h, w, stats, eps, late_trigger=late_trigger)


def decode_keys(keys, confidence=None):
    fn = _fast("decode_keys", keys[0], keys[0].shape[0]) or reference.decode_keys
    return fn(keys, confidence)


def block_front(features, last_token, emb, feature_norm, token_norm, fc, slots, eps: float):
    fn = _fast("block_front", features, features.shape[0]) or reference.block_front
    return fn(features, last_token, emb, feature_norm, token_norm, fc, slots, eps)


def block_attention(qkv, heads: int, S: int):
    fn = (kernel(__name__ + ".triton", "block_attention", qkv) if BLOCK_ATTENTION else None) or reference.block_attention
    return fn(qkv, heads, S)


# off: each drafted position's correction computes all of its product after waiting for the position before (the
# vocabulary kernel before it then lets it launch early); on: the slot's and state's part before the wait
EARLY_CORRECTION = True

# off: the drafter block's attention through torch's scaled_dot_product_attention on a GPU too (cuDNN there)
BLOCK_ATTENTION = True


def first_confidence(stats, state, up, down, eps: float):
    fn = _fast("first_confidence", state, state.shape[0]) or reference.first_confidence
    return fn(stats, state, up, down, eps)


def resolve(x0, prefix, ref, future, future_prefix, keep):
    fn = kernel(__name__ + ".step_triton", "resolve", x0) or reference.resolve
    return fn(x0, prefix, ref, future, future_prefix, keep)


def block_positions(prefix, n, table, page_size: int, scratch_page: int, L: int, x0=None, drafts=None):
    fn = kernel(__name__ + ".step_triton", "block_positions", n) or reference.block_positions
    return fn(prefix, n, table, page_size, scratch_page, L, x0, drafts)


def gather_rows(parts, rows):
    fn = kernel(__name__ + ".step_triton", "gather_rows", rows) or reference.gather_rows
    return fn(parts, rows)


def accept_greedy(logits, drafts, keep, n, snap_n, publish=None):
    fn = kernel(__name__ + ".step_triton", "accept_greedy", logits) or reference.accept_greedy
    return fn(logits, drafts, keep, n, snap_n, publish)
