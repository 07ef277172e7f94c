"""Triton row argmax (`kestrel.ops.argmax` on CUDA: the sampler's greedy rows): one program per row, the whole row
in registers, its loads all in flight at once, then three block reductions.

torch's CUDA argmax took 11.2 us for a [1, 32000] bf16 row on the H200 (k3-mini, 2026-12-03), this one 4.9 us
charged. The engine's overlapped batch-1 decode sampling after the graph: 1.333 against 1.344 ms a token. The
decode graph keeps torch's argmax: with this kernel inside it the engine's step was 18 us slower
(benchmarks/device/device_run107.sh and the call after it, docs/kernels.md).
"""

import torch
import triton
import triton.language as tl

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue

# the widest row one program serves (elements); wider rows go to torch
MAX_COLS = 65536


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, V, stride, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[row] = the first index of the row's largest value, a NaN counting as largest (torch.argmax)."""
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK)
    on = idx < V
    v = tl.load(x_ptr + row * stride + idx, mask=on, other=float("-inf")).to(tl.float32)
    nan = (v != v) & on
    first_nan = tl.min(tl.where(nan, idx, BLOCK), 0)
    v = tl.where(nan, float("-inf"), v)
    first_max = tl.min(tl.where((v == tl.max(v, 0)) & on, idx, BLOCK), 0)
    tl.store(out_ptr + row, tl.where(first_nan < BLOCK, first_nan, first_max).to(tl.int64))


def argmax(x: torch.Tensor) -> torch.Tensor | None:
    """x.argmax(-1) of a 2-D tensor with unit column stride and at most MAX_COLS columns (None otherwise: the
    caller falls back to torch)."""
    if x.dim() != 2 or x.stride(-1) != 1 or not 0 < x.shape[1] <= MAX_COLS or x.dtype == torch.float64:
        return None
    B, V = x.shape
    out = torch.empty(B, dtype=torch.long, device=x.device)
    if B:
        BLOCK = triton.next_power_of_2(V)
        _argmax_kernel[(B,)](x, out, V, x.stride(0), BLOCK=BLOCK, num_warps=max(1, min(16, BLOCK // 2048)),
                             **pdl_args(x))
    return out
