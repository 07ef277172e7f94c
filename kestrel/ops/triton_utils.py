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
