"""Ops: a plain-torch reference.py beside each fast kernel; each op package's __init__ picks one by device.

The reference path runs everywhere (CPU; GPU when Triton or a kernel is missing, or inside `reference_ops()`);
Triton kernels run on CUDA tensors.
"""

import functools
import importlib

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
