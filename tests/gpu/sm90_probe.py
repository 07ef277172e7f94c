"""A kernel the Triton interpreter runs but the compiler rejects (tests/ops/test_sm90_compile.py): with WIDE its
helper returns an int64 from the constexpr branch, and the compiler also types the return after it (fp32), which
the interpreter never reaches. The shape of the expert-kernel refactor's error of 2026-12-05."""

import triton
import triton.language as tl


@triton.jit
def _pick(x, y, WIDE: tl.constexpr):
    if WIDE:
        return x.to(tl.int64)
    return y


@triton.jit
def probe_kernel(x_ptr, y_ptr, out_ptr, WIDE: tl.constexpr, PDL: tl.constexpr):
    i = tl.arange(0, 16)
    v = _pick(tl.load(x_ptr + i), tl.load(y_ptr + i), WIDE)
    tl.store(out_ptr + i, v.to(tl.float32))
