"""Device-side helpers shared by the Triton kernels."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Under programmatic dependent launch: let the next kernel launch now, then wait until the previous one has
    finished and its writes are visible (call before reading any input another kernel produced)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def act(a, b, beta, linear_beta, SITU: tl.constexpr):
    """The gated-MLP activation act(a, b) in fp32: SiTU with its two betas, or SwiGLU's silu(a) * b."""
    if SITU:
        # beta tanh(a / beta) = beta (2 sigmoid(2 a / beta) - 1)
        return beta * (2.0 * tl.sigmoid(2.0 * a / beta) - 1.0) * tl.sigmoid(a) * (
            linear_beta * (2.0 * tl.sigmoid(2.0 * b / linear_beta) - 1.0))
    return a * tl.sigmoid(a) * b
