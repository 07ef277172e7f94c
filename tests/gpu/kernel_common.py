"""What the Triton kernel tests share: where they run (CUDA, or the Triton interpreter on CPU tensors with
TRITON_INTERPRET=1), the shapes and tolerances for each, and the comparison helpers."""

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_TRITON = importlib.util.find_spec("triton") is not None
KERNEL_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_TRITON or not (torch.cuda.is_available() or INTERPRET),
                                                  reason="needs CUDA + Triton (or TRITON_INTERPRET=1)")]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# interpreter-sized shapes vs real kernel shapes
SMALL = not torch.cuda.is_available()
# the interpreter truncates when casting to bf16 instead of rounding: looser there
TOL = {torch.float32: 1e-4, torch.bfloat16: 4e-2 if SMALL else 1.5e-2}
# fp32 recurrent states fed by bf16 inputs: a quarter of the activations' tolerance (half under the interpreter,
# whose truncating bf16 casts drift the folded states to ~1.0-1.4e-2 over a few steps)
STATE_TOL = {torch.float32: TOL[torch.float32] / 4, torch.bfloat16: TOL[torch.bfloat16] / (2 if INTERPRET else 4)}
DOT_DTYPES = [torch.float32] if SMALL else [torch.float32, torch.bfloat16]


def rel(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite (unwritten?) output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def rnd(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)
