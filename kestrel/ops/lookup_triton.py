"""Triton context lookup (`kestrel.spec.lookup` on CUDA). The step: one program per row appends the row's last
committed token to its window, writes the new window, and searches it for the latest earlier occurrence of its
last n-gram, longest n first, with the whole window in registers; `select` also picks each block's drafts (the
lookup's where the drafter's confidence is low). One launch where the torch formulation (`lookup.append` +
`lookup.lookup` + the choice) takes about forty. `append`: the accepted drafts into the windows, one launch.
"""

import torch
import triton
import triton.language as tl

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue


@triton.jit
def _lookup_step_kernel(win_ptr, x0_ptr, real_ptr, out_ptr, cand_ptr, found_ptr, drafts_ptr, conf_ptr, tok_ptr, below,
                        W: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
                        SELECT: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, W)
    shift = (tl.load(real_ptr + row) != 0).to(tl.int32)
    x0 = tl.load(x0_ptr + row)
    # the new window: old[i + 1] and x0 last for a real row, the old window for a padding row
    src = offs + shift
    new = tl.load(win_ptr + row * W + src, mask=src < W, other=0)
    new = tl.where(src >= W, x0, new)
    out = out_ptr + row * W
    tl.store(out + offs, new)
    tl.debug_barrier()  # the stores above are read back below by other threads of this program
    best = tl.full([], -1, tl.int32)  # where the continuation starts
    for n in tl.static_range(MIN_N, MAX_N + 1):
        hit = offs < W - n
        for j in tl.static_range(n):
            a = tl.load(out + offs + j, mask=offs + j < W, other=-2)
            b = tl.load(out + (W - n + j))
            hit = hit & (a == b) & (b >= 0)
        last = tl.max(tl.where(hit, offs, -1), 0)
        best = tl.where(last >= 0, last + n, best)  # a longer n-gram's match wins
    start = tl.maximum(best, 0)
    period = tl.maximum(W - start, 1)
    g = tl.arange(0, GP)
    cand = tl.load(out + tl.minimum(start + g % period, W - 1), mask=g < G, other=0)
    tl.store(cand_ptr + row * G + g, cand, mask=g < G)
    tl.store(found_ptr + row, best >= 0)
    if SELECT:  # the block takes the lookup where there is one and the drafter doubts its first draft
        use = (best >= 0) & (tl.load(conf_ptr + row) < below)
        drafts = tl.load(drafts_ptr + row * G + g, mask=g < G, other=0)
        tl.store(tok_ptr + row * G + g, tl.where(use, cand, drafts), mask=g < G)


def _served(window: torch.Tensor, max_n: int) -> bool:
    W = window.shape[1]
    return window.dtype == torch.int64 and not W & (W - 1) and W > max_n and window.is_contiguous()


def _launch_step(window, x0, real, gamma, min_n, max_n, drafts=None, confidence=None, below: float = 0.0):
    B, W = window.shape
    out = torch.empty_like(window)
    cand = torch.empty(B, gamma, dtype=torch.int64, device=window.device)
    found = torch.empty(B, dtype=torch.bool, device=window.device)
    select = drafts is not None
    tokens = torch.empty_like(cand) if select else cand
    if B:
        _lookup_step_kernel[(B,)](window, x0.contiguous(), real.contiguous(), out, cand, found,
                                  drafts.contiguous() if select else cand,
                                  confidence.float().contiguous() if select else found, tokens, float(below), W=W,
                                  G=gamma, GP=triton.next_power_of_2(gamma), MIN_N=min_n, MAX_N=max_n, SELECT=select,
                                  num_warps=4, **pdl_args(window))
    return out, cand, found, tokens


def step(window: torch.Tensor, x0: torch.Tensor, real: torch.Tensor, gamma: int, min_n: int, max_n: int):
    """See `kestrel.spec.lookup.step`; None where the kernel does not serve (the caller uses torch)."""
    if not _served(window, max_n):
        return None
    return _launch_step(window, x0, real, gamma, min_n, max_n)[:3]


def select(window: torch.Tensor, x0: torch.Tensor, real: torch.Tensor, gamma: int, drafts: torch.Tensor,
           confidence: torch.Tensor, below: float, min_n: int, max_n: int):
    """See `kestrel.spec.lookup.select`; None where the kernel does not serve."""
    if not _served(window, max_n) or drafts.dtype != torch.int64 or drafts.shape != (window.shape[0], gamma):
        return None
    out, _, _, tokens = _launch_step(window, x0, real, gamma, min_n, max_n, drafts, confidence, below)
    return out, tokens


@triton.jit
def _append_kernel(win_ptr, tok_ptr, count_ptr, out_ptr, K, W: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.minimum(tl.maximum(tl.load(count_ptr + row).to(tl.int32), 0), K)
    offs = tl.arange(0, W)
    src = offs + c  # the position in [window, tokens] that lands at offs
    old = tl.load(win_ptr + row * W + src, mask=src < W, other=0)
    new = tl.load(tok_ptr + row * K + (src - W), mask=src >= W, other=0)
    tl.store(out_ptr + row * W + offs, tl.where(src < W, old, new))


def append(window: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor):
    """See `kestrel.spec.lookup.append`; None where the kernel does not serve."""
    B, W = window.shape
    if window.dtype != torch.int64 or tokens.dtype != torch.int64 or W & (W - 1) or not window.is_contiguous():
        return None
    out = torch.empty_like(window)
    if B:
        _append_kernel[(B,)](window, tokens.contiguous(), count.contiguous(), out, tokens.shape[1], W=W, num_warps=4,
                             **pdl_args(window))
    return out
