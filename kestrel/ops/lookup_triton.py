"""Triton context lookup step (`kestrel.spec.lookup.step` on CUDA): one program per row appends the row's last
committed token to its window, writes the new window, and searches it for the latest earlier occurrence of its
last n-gram, longest n first, with the whole window in registers. One launch where the torch formulation
(`lookup.append` + `lookup.lookup`) takes about forty.
"""

import torch
import triton
import triton.language as tl

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue


@triton.jit
def _lookup_step_kernel(win_ptr, x0_ptr, real_ptr, out_ptr, cand_ptr, found_ptr, W: tl.constexpr, G: tl.constexpr,
                        GP: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr, PDL: tl.constexpr):
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


def step(window: torch.Tensor, x0: torch.Tensor, real: torch.Tensor, gamma: int, min_n: int, max_n: int):
    """See `kestrel.spec.lookup.step`; None where the kernel does not serve (the caller uses torch)."""
    B, W = window.shape
    if window.dtype != torch.int64 or W & (W - 1) or W <= max_n or not window.is_contiguous():
        return None
    out = torch.empty_like(window)
    cand = torch.empty(B, gamma, dtype=torch.int64, device=window.device)
    found = torch.empty(B, dtype=torch.bool, device=window.device)
    if B:
        _lookup_step_kernel[(B,)](window, x0.contiguous(), real.contiguous(), out, cand, found, W=W, G=gamma,
                                  GP=triton.next_power_of_2(gamma), MIN_N=min_n, MAX_N=max_n, num_warps=4,
                                  **pdl_args(window))
    return out, cand, found
