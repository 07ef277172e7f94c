"""Device-side helpers shared by the Gluon kernels (Triton's lower-level dialect, which cannot call Triton
functions): grid dependency control and the activations, written as the Triton helpers compute them."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gdc_launch_dependents():
    """triton.language.extra.cuda.gdc_launch_dependents: the next kernel may launch (PDL)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def gdc_wait():
    """triton.language.extra.cuda.gdc_wait: the kernel before has finished and its writes are visible (PDL)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def sigmoid(x):
    return 1 / (1 + gl.exp(-x))  # tl.sigmoid's own formula, so the results are bit-equal to the Triton kernels'


@gluon.jit
def act(a, b, beta, linear_beta, SITU: gl.constexpr):
    """triton_utils.act: the gated-MLP activation in fp32, SiTU with its two betas or SwiGLU's silu(a) * b."""
    if SITU:
        return beta * (2.0 * sigmoid(2.0 * a / beta) - 1.0) * sigmoid(a) * (
            linear_beta * (2.0 * sigmoid(2.0 * b / linear_beta) - 1.0))
    return a * sigmoid(a) * b


def row_layout(K: int, rows: int, warps: int) -> tuple[int, int, int, int] | None:
    """(threads along rows, along columns, warps along rows, along columns) of a [rows, K] weight tile, 8 columns
    (16 bytes) a thread: the threads and then the warps along the row while it has columns for them. Where K fills
    all the threads (K >= 256 x warps) that is the layout Triton chooses for such a tile (sm_90 TTGIR of the expert
    up GEMV and the paired GEMV: sizePerThread [1, 8], threadsPerWarp [1, 32], warpsPerCTA [1, warps]), so a
    Gluon kernel reduces in the same order. None where the tile does not cover the layout exactly (no element
    copied by two threads)."""
    tc = min(32, K // 8)
    if tc < 1:
        return None
    wc = min(warps, max(1, K // (8 * tc)))
    tr, wr = 32 // tc, warps // wc
    if K % (8 * tc * wc) or rows % (tr * wr):
        return None
    return tr, tc, wr, wc
