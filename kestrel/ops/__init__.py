"""Ops: a plain-torch reference.py beside each fast kernel; each op package's __init__ picks one by device.

The reference path runs everywhere (CPU; GPU when Triton or a kernel is missing, or inside `reference_ops()`);
Triton kernels run on CUDA tensors.
"""

import array
import functools
import importlib
import os

import numpy as np
import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


_FORCE_REFERENCE = False


def use_triton(t: torch.Tensor) -> bool:
    """Whether the fast kernels serve a call on tensor t."""
    return t.is_cuda and not _FORCE_REFERENCE and triton_available()


class reference_ops:
    """Context manager forcing the reference path (GPU-vs-reference comparisons)."""

    def __enter__(self):
        global _FORCE_REFERENCE
        self._old, _FORCE_REFERENCE = _FORCE_REFERENCE, True

    def __exit__(self, *exc):
        global _FORCE_REFERENCE
        _FORCE_REFERENCE = self._old


def kernel(module: str, name: str, t: torch.Tensor):
    """The fast implementation `module.name` when it exists and serves tensor t, else None."""
    if not use_triton(t):
        return None
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return None
    return getattr(mod, name, None)


# Programmatic dependent launch (Hopper and later): the decode kernels launch with it, signal their dependents as
# soon as they start and wait for their predecessor (griddepcontrol.wait) before reading its outputs, so a kernel's
# launch and prologue overlap the previous kernel's tail; the GEMV streams its weights before it waits. Every
# PDL-launched kernel waits before it finishes, so completion stays transitive down the stream.
# The engine sets this at start-up, before graph capture (on unless --disable-pdl): the k3-mini decode graph ran
# 1.72 ms against 2.30 ms with it, bit-identical, and the whole GPU suite passes with it on (the one-time "stall" of
# an earlier session was Triton compilation in a serial run). Process-wide, like the kernel caches; off until an
# engine starts, so the kernel tests choose it themselves.
PDL = False


def triton_interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1) instead of compiling them."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _pdl_device(index: int) -> bool:
    return not triton_interpreted() and torch.cuda.get_device_capability(index)[0] >= 9


def pdl(t: torch.Tensor) -> bool:
    """Whether kernels on t's device launch with programmatic dependent launch (pass as launch_pdl and PDL)."""
    if not (PDL and t.is_cuda):
        return False
    return _pdl_device(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_args(t: torch.Tensor) -> dict:
    """Launch keywords of a PDL-aware kernel (one with a `PDL: tl.constexpr` that calls pdl_prologue)."""
    on = pdl(t)
    return {"PDL": on, "launch_pdl": on}


_TYPECODES = {torch.long: "q", torch.int32: "i"}


def int_tensor(values: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A CPU tensor of a list of Python ints, through an `array` buffer the tensor shares: several times faster
    than `torch.tensor` on the list (a batch-64 decode step's ~6k integers: ~0.1 against ~0.6 ms on this CPU). A
    value out of the dtype's range raises OverflowError."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype)


def host_ints(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list of ints or bools, or a CPU tensor) as a tensor on `device`, without waiting for the
    device: `torch.tensor(values, device=cuda)` copies and then synchronises the stream, so each call stalled the
    host until the queue drained (133 such stalls in a k3-mini prefill of 64 prompts: `benchmarks/prefill_batch.py
    --sync-debug`). A non-blocking copy from pageable memory is staged by the driver before it returns (pinning
    each copy's source cost more on the H200's host: `benchmarks/host_copies.py`)."""
    if isinstance(values, torch.Tensor):
        t = values
    else:
        t = int_tensor(values, dtype) if dtype in _TYPECODES else torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True) if torch.device(device).type == "cuda" else t.to(device)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1): the first index of each row's largest value (a NaN counts as largest), as int64 on x's
    device. CUDA rows go through a Triton kernel (ops/reduce_triton.py). fp32 / fp64 CPU tensors go through NumPy,
    whose vectorised argmax this torch build's CPU kernel is 10-25x slower than (a [64, 4096] fp32 batch: 520
    against 22 us on one core; `tests/ops/test_misc_ops.py` compares the two on ties, NaNs and infinities). A
    single row stays with torch: between a batch-1 decode's forwards it took 20 us a call there against 40 through
    NumPy (k3-small, ad hoc; in a tight loop both take a few us)."""
    if x.device.type == "cuda":  # one Triton program per row (ops/reduce_triton.py) where it serves
        fn = kernel(__name__ + ".reduce_triton", "argmax", x)
        out = fn(x) if fn is not None else None
        return out if out is not None else x.argmax(-1)
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.numel() == x.shape[-1:].numel():
        return x.argmax(-1)
    return torch.from_numpy(np.asarray(x.detach().numpy().argmax(-1), dtype=np.int64))
