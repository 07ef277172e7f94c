"""Linear layers. Quantised storage, LoRA and tensor parallelism belong here, not in the model files."""

import collections

import torch
import torch.nn.functional as F
from torch import nn

from kestrel.ops import linear as linear_ops
from kestrel.ops.mxfp4 import reference as mxfp4


class Linear(nn.Module):
    """y = x W^T (+ b), W [out, in]."""

    # whether cpu_kmajor_layout may store the weight K-major (off for a weight read other than through the product,
    # e.g. viewed per head)
    cpu_kmajor = True

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None, late_trigger: bool = False) -> torch.Tensor:
        """add: a residual summed into the output (in the GEMV's epilogue on GPU); late_trigger: see
        linear_ops.linear (a sublayer's last projection: the settle after it reads the stream early)."""
        if self.bias is not None:
            y = F.linear(x, self.weight, self.bias)
            return y if add is None else y + add
        if (y := linear_ops.kmajor_linear(self, x, self.weight)) is not None:  # a large weight's one-row CPU product
            return y if add is None else y + add
        return linear_ops.linear(x, self.weight, add, late_trigger)

    def forward_with(self, pro: linear_ops.Prologue, add: torch.Tensor | None = None,
                     late_trigger: bool = False) -> torch.Tensor:
        """self(pro.apply(), add): the input made by a prologue, inside the GEMV where one serves the call."""
        if self.bias is not None:
            return self(pro.apply(), add)
        return linear_ops.linear_with(pro, self.weight, add, late_trigger)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}"


def cpu_kmajor_layout(model: nn.Module) -> int:
    """The CPU inference layout of `model`'s linear layers (kestrel's and torch's): each weight [out, in] moves to
    K-major storage ([in, out] contiguous) and the parameter becomes its transposed view, so shapes, values and
    every op reading it are unchanged. MKL's small-row products run faster over that layout (a k3-small
    speculative verify forward, 8 rows: ~8% faster; prefill, batch 64 and one-row decode: unchanged; see
    docs/benchmarks.md, session of 2026-12-03 14:02). Skips weights shared with another module (a tied LM head is
    the embedding table, which looks up rows), weights not on the CPU or not floating point, and layers with
    `cpu_kmajor = False`. Returns the number of weights moved."""
    shared = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    moved = 0
    for m in model.modules():
        if not isinstance(m, (Linear, nn.Linear)) or not getattr(m, "cpu_kmajor", True):
            continue
        w = m.weight
        if (w.dim() != 2 or w.device.type != "cpu" or not w.is_floating_point() or shared[id(w)] > 1
                or not w.is_contiguous()):
            continue
        with torch.no_grad():
            w.data = w.data.t().contiguous().t()
        moved += 1
    return moved


def linear_pair(a: Linear, pro_a: linear_ops.Prologue, b: Linear, pro_b: linear_ops.Prologue,
                late_trigger: bool = False) -> torch.Tensor:
    """b.forward_with(pro_b, add=a.forward_with(pro_a)): two projections summed into one output, one launch where
    the one-row GEMV serves both."""
    if a.bias is None and b.bias is None:
        return linear_ops.linear_pair(pro_a, a.weight, pro_b, b.weight, late_trigger)
    return b.forward_with(pro_b, a.forward_with(pro_a), late_trigger)


class ExpertWeights(nn.Module):
    """Routed-expert weights stacked per expert: w1, w3 [E, I, D] (gate, up) and w2 [E, D, I] (down).

    Either dense parameters or MXFP4 (compressed-tensors layout: `{name}_packed` uint8 [E, out, in / 2] and
    `{name}_scale` uint8 [E, out, in / 32]); `dense(name)` returns the weights in the compute dtype either way.
    """

    def __init__(self, num_experts: int, hidden: int, inter: int, quantized: bool = False, dtype=None):
        super().__init__()
        self.num_experts, self.hidden, self.inter, self.quantized = num_experts, hidden, inter, quantized
        self.dtype = dtype
        shapes = {"w1": (inter, hidden), "w2": (hidden, inter), "w3": (inter, hidden)}
        for name, (out_f, in_f) in shapes.items():
            if quantized:
                self.register_buffer(f"{name}_packed", torch.zeros(num_experts, out_f, in_f // 2, dtype=torch.uint8))
                self.register_buffer(f"{name}_scale", torch.zeros(num_experts, out_f, in_f // 32, dtype=torch.uint8))
            else:
                self.register_parameter(name, nn.Parameter(torch.empty(num_experts, out_f, in_f, dtype=dtype)))

    def dense(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        if not self.quantized:
            return getattr(self, name)
        packed, scale = getattr(self, f"{name}_packed"), getattr(self, f"{name}_scale")
        E = packed.shape[0]
        w = mxfp4.dequantize(packed.flatten(0, 1), scale.flatten(0, 1), dtype or self.dtype or torch.float32)
        return w.view(E, packed.shape[1], -1)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, {self.hidden} <-> {self.inter}, mxfp4={self.quantized}"


class FusedLinears:
    """Several Linear layers over the same input served by one GEMM, without duplicating memory: their weights are
    moved into one [sum(out), in] buffer and each layer's parameter becomes a view of its rows (state_dict, loading
    and the unfused forward keep working). `valid()` checks that nothing re-homed a weight since (a loader or an
    adapter swap); callers fall back to the separate layers when it returns False.
    """

    def __init__(self, *linears: Linear):
        w0 = linears[0].weight
        assert all(l.bias is None and l.in_features == linears[0].in_features for l in linears)
        self.linears = linears
        self.sizes = [l.out_features for l in linears]
        self.weight = torch.empty(sum(self.sizes), w0.shape[1], dtype=w0.dtype, device=w0.device)
        off = 0
        for l, n in zip(linears, self.sizes):
            self.weight[off : off + n].copy_(l.weight.data)
            l.weight.data = self.weight[off : off + n]
            off += n
        self._ptrs = [l.weight.data_ptr() for l in linears]

    def valid(self) -> bool:
        return [l.weight.data_ptr() for l in self.linears] == self._ptrs

    def __call__(self, x: torch.Tensor, late_trigger: bool = False) -> list[torch.Tensor]:
        return list(linear_ops.linear(x, self.weight, late_trigger=late_trigger).split(self.sizes, dim=-1))

    def part(self, x: torch.Tensor, start: int, stop: int, late_trigger: bool = False) -> list[torch.Tensor]:
        """The outputs of layers start..stop-1 alone, from one GEMM over their rows of the buffer (adjacent rows,
        so a contiguous view: nothing is copied)."""
        lo, hi = sum(self.sizes[:start]), sum(self.sizes[:stop])
        y = linear_ops.linear(x, self.weight[lo:hi], late_trigger=late_trigger)
        return list(y.split(self.sizes[start:stop], dim=-1))


class StackedLinears(FusedLinears):
    """Linear layers of one shape over different inputs that sit side by side in one tensor (adjacent column
    groups of a fused GEMM's output), served by one launch: their weights are stacked as in FusedLinears, and
    layer j reads column group j of the input (see linear_ops.linear_stacked)."""

    def __init__(self, *linears: Linear):
        assert all(l.out_features == linears[0].out_features for l in linears)
        super().__init__(*linears)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return linear_ops.linear_stacked(x, self.weight, len(self.linears))
