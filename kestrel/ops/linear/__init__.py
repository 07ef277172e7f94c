"""Linear y = x W^T, dispatched by device and shape: on CUDA, decode-sized batches take the Triton GEMV, which
streams each weight row once with the rows of x held in registers (up to four rows for any weight, up to eight for
a small one: see gemv_rows); everything else (and every CPU call) is F.linear."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kestrel.ops import kernel
from kestrel.ops.linear import reference

# measured on the H200 with weights streamed from HBM (docs/kernels.md): at one row the GEMV beats cuBLAS by
# 1.1-1.4x; at eight rows cuBLAS (tensor cores) is 2-4x faster. In k3-mini's decode graph (PDL, with the prologues
# and pairs the GEMV takes, each row in programs of its own: linear.triton.ROW_GRID_LARGE_MAX_M) every large weight
# on the GEMV made the whole step 1.29x faster at batch 2, 1.13x at batch 3, 1.02x at batch 4 and 0.79x at batch 8
# (`benchmarks/gemv_rows.py`, docs/kernels.md)
GEMV_MAX_M = 4
# ... but a small weight (L2-resident, a few us of work) is launch-bound either way: there the GEMV also serves up to
# SMALL_GEMV_MAX_M rows (a speculative verify block, the drafter's block), because it launches under programmatic
# dependent launch and takes the prologues and pairs, where cuBLAS costs a plain launch and the ops around it theirs
SMALL_GEMV_MAX_M = 8
SMALL_WEIGHT = 1 << 20  # elements (k3-small's largest, its 4096 x 256 lm_head)


def small_weight(weight: torch.Tensor) -> bool:
    """Whether a weight is small (L2-resident): the GEMVs then serve several rows, each row in its own programs."""
    return weight.numel() <= SMALL_WEIGHT


def gemv_rows(weight: torch.Tensor) -> int:
    """The most input rows the GEMV serves for this weight."""
    return SMALL_GEMV_MAX_M if small_weight(weight) else GEMV_MAX_M


def linear(x: torch.Tensor, weight: torch.Tensor, add: torch.Tensor | None = None,
           late_trigger: bool = False) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ add, a residual of the output's shape) -> [..., N] in the wider of the two
    dtypes (an fp32 router weight reads bf16 activations without a converted copy on the GEMV path; the GEMV adds
    `add` in its epilogue, rounding as the separate add would). late_trigger: every kernel before this call has
    finished when the next kernel starts (under programmatic dependent launch the GEMV lets its dependents launch
    only after its own wait; every other path launches plainly, which orders the same)."""
    if x.device.type == "cpu" and x.dtype == weight.dtype:  # the reference without its casts and dispatch checks
        y = F.linear(x, weight)  # (~10 us a call on this path, ~100 calls a k3-small token)
        return y if add is None else y + add
    rows = x.numel() // max(1, x.shape[-1])
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if (rows > gemv_rows(weight) or torch.float64 in (x.dtype, weight.dtype) or not weight.is_contiguous()
            or (add is not None and add.dtype != out_dtype)):
        return reference.linear(x, weight, add)
    fn = kernel(__name__ + ".triton", "linear", x)
    if fn is None:
        return reference.linear(x, weight, add)
    shape = (*x.shape[:-1], weight.shape[0])
    return fn(x.reshape(rows, x.shape[-1]), weight, None if add is None else add.reshape(rows, weight.shape[0]),
              late_trigger=late_trigger).view(shape)


# On a CPU a one-row product with a weight this large (bytes) reads a K-major copy of it ([K, N] contiguous): such a
# weight comes from DRAM (k3-small's working set exceeds the last-level cache), and MKL's GEMV streamed the
# row-major [N, K] weight at about half the rate of the same product over a K-major copy (4096 x 256 fp32 with a
# cold cache: 810-1060 us against 420-530 us; below ~1 MB the two were equal). `benchmarks/cpu_gemv.py` times both.
KMAJOR_MIN_BYTES = 1 << 20


class KMajorGemv:
    """The one-row CPU product x @ weight^T through a K-major copy of `weight`, made on first use and again whenever
    the weight is replaced or changed in place (its storage or version counter moved). Holds the copy: one per
    large inference weight (k3-small's lm_head: 4 MB)."""

    def __init__(self):
        self._copy, self._key = None, None

    @staticmethod
    def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
        # the size first: it rules out almost every layer, and the test runs on every call of every layer
        return (weight.numel() * weight.element_size() >= KMAJOR_MIN_BYTES and x.device.type == "cpu"
                and x.dim() == 2 and x.shape[0] == 1 and x.dtype == weight.dtype and weight.dim() == 2
                and not (torch.is_grad_enabled() and weight.requires_grad))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        key = (weight.data_ptr(), weight._version, weight.shape, weight.dtype)
        if key != self._key:
            self._copy, self._key = weight.detach().t().contiguous(), key
        return x @ self._copy


def kmajor_linear(owner: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x @ weight^T through `owner`'s KMajorGemv (made on first use) where one serves the call, else None."""
    if not KMajorGemv.serves(x, weight):
        return None
    gemv = owner.__dict__.get("_kmajor")
    if gemv is None:
        gemv = owner.__dict__["_kmajor"] = KMajorGemv()
    return gemv(x, weight)


@dataclass
class Prologue:
    """How a linear layer's input is made from the previous op's outputs, so the one-row GEMV can build it itself
    (one launch fewer): kind "act" (act(x, other) of a gated MLP), "rms" (RMSNorm(x) * weight), "gated_rms"
    (per group of `group` channels RMSNorm(x) * weight * sigmoid(other), KDA's output norm), "gated_rms_sig" (the
    same with `other` holding sigmoid(gate) already, in fp32), "gate" (x * sigmoid(other), MLA's output gate) or
    "none" (x as it is). `apply` computes the same input with the ordinary ops: every path the fused GEMV does not
    serve."""

    kind: str
    x: torch.Tensor
    apply: Callable[[], torch.Tensor]
    other: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    eps: float = 0.0
    group: int = 0
    act: object = None  # kestrel.ops.moe.Activation for "act"


# off: every prologue runs as its own op (the decode ladder's "before" stage)
FUSE_PROLOGUES = True


def _gemv_input(pro: Prologue, weight: torch.Tensor) -> bool:
    """Whether a prologue's input is one the GEMV reads (2-D, at most gemv_rows rows, the weight's dtype, unit
    stride)."""
    x = pro.x
    return (x.dim() == 2 and 0 < x.shape[0] <= gemv_rows(weight) and x.dtype == weight.dtype != torch.float64
            and weight.is_contiguous() and x.stride(-1) == 1 and (pro.other is None or pro.other.stride(-1) == 1))


def linear_with(pro: Prologue, weight: torch.Tensor, add: torch.Tensor | None = None,
                late_trigger: bool = False) -> torch.Tensor:
    """linear(pro.apply(), weight, add) for 2-D inputs, with the prologue inside the GEMV where it serves the call."""
    x = pro.x
    if FUSE_PROLOGUES and _gemv_input(pro, weight) and (add is None or add.dtype == x.dtype):
        fits = kernel(__name__ + ".triton", "fits_prologue", x)
        if fits is not None and fits(*weight.shape):
            return kernel(__name__ + ".triton", "linear", x)(x, weight, add, pro, late_trigger=late_trigger)
    return linear(pro.apply(), weight, add, late_trigger)


# off: a sublayer's two summed projections run as two GEMVs (the decode ladder's stage before the pair)
FUSE_PAIRS = True


def linear_pair(pro_a: Prologue, weight_a: torch.Tensor, pro_b: Prologue, weight_b: torch.Tensor,
                late_trigger: bool = False) -> torch.Tensor:
    """linear_with(pro_b, weight_b, add=linear_with(pro_a, weight_a)): two projections into one output, summed as
    the second's epilogue sums a residual. One launch where the one-row GEMV serves both (bit-equal to the two)."""
    if (FUSE_PROLOGUES and FUSE_PAIRS and _gemv_input(pro_a, weight_a) and _gemv_input(pro_b, weight_b)
            and pro_a.x.shape[0] == pro_b.x.shape[0] and weight_a.shape[0] == weight_b.shape[0]
            and weight_a.dtype == weight_b.dtype and not {"gated_rms", "gated_rms_sig"} & {pro_a.kind, pro_b.kind}):
        fits = kernel(__name__ + ".triton", "fits_pair", pro_a.x)
        if fits is not None and fits(weight_a.shape[0], weight_a.shape[1], weight_b.shape[1]):
            pair = kernel(__name__ + ".triton", "linear_pair", pro_a.x)
            return pair(pro_a.x, weight_a, pro_a, pro_b.x, weight_b, pro_b, late_trigger=late_trigger)
    return linear_with(pro_b, weight_b, linear_with(pro_a, weight_a), late_trigger)


def linear_stacked(x: torch.Tensor, weight: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """`groups` linear layers of equal shape stacked in one weight [groups * N, K], layer j reading columns
    [j K, (j + 1) K) of x [M, groups * K] (rows may be strided): the list of the layers' outputs [M, N], from one
    launch where the one-row GEMV serves the call."""
    N, K = weight.shape[0] // groups, weight.shape[1]
    if (x.dim() == 2 and 0 < x.shape[0] <= gemv_rows(weight[:N]) and x.dtype == weight.dtype != torch.float64
            and weight.is_contiguous() and x.stride(-1) == 1 and N % 8 == 0):
        fn = kernel(__name__ + ".triton", "linear", x)
        if fn is not None:
            return list(fn(x, weight, groups=groups).split(N, dim=-1))
    return [linear(x[:, j * K : (j + 1) * K], weight[j * N : (j + 1) * N]) for j in range(groups)]
