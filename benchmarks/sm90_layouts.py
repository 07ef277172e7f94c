"""Layout conversions and barriers of the Triton kernels as compiled for sm_90, on any machine (issue 9).

A `convert_layout` in a kernel's TTGIR is a round trip through shared memory with barriers; in a one-CTA kernel on
the decode chain each one after the PDL wait is latency the step pays. The AttnRes settle lost ~2 us a link to them
at 6 bank values (docs/kernels.md, 2026-12-07 14:30). This runs kernel tests under the Triton interpreter with
tests/gpu/sm90.py's compile hook (every launch also compiled for sm_90, PDL off and on) and prints, for each kernel's
PDL specialisations, the conversions in its TTGIR and the `bar.sync` in its PTX, all and after the wait.
The interpreter's test shapes are small (tests/gpu/kernel_common.SMALL): compile a kernel at its real shapes by
launching it on CPU tensors under the hook (as tests/ops/test_sm90_compile.py does for the settle).

    PYTHONPATH=. python benchmarks/sm90_layouts.py                      # the compile check's subset of kernel tests
    PYTHONPATH=. python benchmarks/sm90_layouts.py tests/gpu/test_kernels.py -k kda
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["KESTREL_SM90_COMPILE"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from tests.gpu import sm90  # noqa: E402

def main():
    from tests.ops.test_sm90_compile import SUBSET

    sm90.kept = []
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *(sys.argv[1:] or SUBSET)])
    rows: dict = {}  # kernel -> [(conversions, barriers, barriers after the wait)] of its PDL specialisations
    for kernel in sm90.kept:
        counts = sm90.layout_counts(kernel)
        if counts[2] is not None:
            rows.setdefault(kernel.name, []).append(counts)
    span = lambda v: f"{min(v)}-{max(v)}" if min(v) != max(v) else f"{v[0]}"  # noqa: E731
    print("\n| kernel (PDL) | specialisations | layout conversions | barriers | after the wait |")
    print("|---|---|---|---|---|")
    for name, counts in sorted(rows.items()):
        conv, bars, after = zip(*counts)
        print(f"| {name} | {len(counts)} | {span(conv)} | {span(bars)} | {span(after)} |")
    return rc


if __name__ == "__main__":
    sys.exit(main())
