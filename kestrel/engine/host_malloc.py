"""glibc's malloc set to keep freed host memory, for engines that compute on the CPU.

A CPU prefill allocates and frees temporaries of megabytes per op (a [2048, 768] fp32 activation is 6 MB). glibc
serves blocks that large from fresh mmap()s and gives the top of its heap back to the system once more than a
trim threshold of it is free, so the next op's temporary touches new pages: one page fault per 4 KB, each time.
On this project's CPU machine a k3-small prefill of 2,048 tokens took ~45,000 minor page faults a forward; with
the settings below, ~600, and 0.61 -> 0.54 s (benchmarks/offline_throughput.py, docs/benchmarks.md). Decode steps
were not faulting: their temporaries are small enough for glibc's own adaptive threshold.

The settings are glibc's `mallopt` (what tcmalloc or jemalloc, which PyTorch's CPU guides preload, do by design):
allocations up to MMAP_THRESHOLD come from the heap, and freed memory stays there up to TRIM_THRESHOLD. The cost
is that the process keeps its peak heap. They are process-wide and stay set; `--disable-host-malloc-tuning` skips
them. Elsewhere than glibc (macOS, musl) nothing is changed.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20  # the largest value glibc accepts on 64-bit (half its 64 MB heap size)
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20  # the heap grows in steps this large, not one sbrk() per block

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the settings once per process; True when glibc took them."""
    global _done
    if _done is None:
        _done = _apply()
    return _done


def mallopt():
    """glibc's mallopt, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def _apply() -> bool:
    fn = mallopt()
    return fn is not None and all(fn(opt, val) == 1 for opt, val in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
