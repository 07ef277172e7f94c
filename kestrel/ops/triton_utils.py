"""Device-side helpers shared by the Triton kernels."""

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import triton_interpreted


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


@triton.jit
def act_input(a, b, beta, linear_beta, SITU: tl.constexpr, dt: tl.constexpr):
    """A gated MLP's down-projection input act(a, b) (fp32 values of dtype dt in, fp32 out), rounded as the unfused
    ops round it: SiTU as the activation kernel computes it (fp32 throughout, one rounding); SwiGLU as torch's
    silu(a) * b (silu rounded, then the product)."""
    if SITU:
        return act(a, b, beta, linear_beta, SITU).to(dt).to(tl.float32)
    return ((a * tl.sigmoid(a)).to(dt).to(tl.float32) * b).to(dt).to(tl.float32)


# Host-side launch: Triton's `fn[grid](...)` binds the arguments, specialises each one, builds a cache key (it
# formats the options to a string on every call) and checks the kernel's globals before it launches: tens of
# microseconds a launch, which a prefill call with a handful of launches pays before and between its kernels.
# `launch` keys the compiled kernel on what Triton specialises on (each tensor's dtype and 16-byte alignment, each
# int's value class, the constexprs and options) and, from the second call with that key, hands the arguments to the
# compiled kernel's launcher directly.
_COMPILED: dict = {}


def _spec(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, bool) or not isinstance(a, int):
        return type(a)
    # Triton makes 1 a constant, marks multiples of 16 and widens to int64 beyond int32
    return int, a == 1, a % 16 == 0, -2**31 <= a < 2**31


def _hooked(hook) -> bool:
    """Whether a launch hook is set (a profiler's, e.g. proton): None, or from Triton 3.5 a chain of hooks."""
    return bool(getattr(hook, "calls", hook))


def launch(fn, grid, *args, **meta):
    """fn[grid](*args, **meta) with fn's parameters in order: the non-constexpr ones positionally, then the constexprs
    and launch options (num_warps, ...) by keyword. The first call of each specialisation goes through Triton's JIT
    (compiling if needed); later ones launch the compiled kernel directly on the current stream."""
    if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook) or triton_interpreted():
        fn[grid](*args, **meta)
        return
    dev = driver.active.get_current_device()
    key = (fn, dev, tuple(map(_spec, args)), tuple(meta.items()))
    hit = _COMPILED.get(key)
    if hit is None:
        if any(p.is_constexpr for p in fn.params[:len(args)]):
            raise TypeError(f"launch({fn.__name__}): pass constexpr parameters by keyword")
        kernel = fn[grid](*args, **meta)
        _COMPILED[key] = (kernel, tuple(meta.get(p.name, p.default) for p in fn.params[len(args):]))
        return
    kernel, consts = hit
    g = tuple(grid) + (1, 1)
    kernel.run(g[0], g[1], g[2], driver.active.get_current_stream(dev), kernel.function,
               kernel.packed_metadata, None, None, None, *args, *consts)
