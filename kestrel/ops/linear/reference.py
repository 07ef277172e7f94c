"""Plain-torch linear: y = x W^T, the oracle of the skinny (decode-sized) GEMM kernel."""

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in the wider of the two dtypes, plus `add` (a residual) when given."""
    dt = torch.promote_types(x.dtype, weight.dtype)
    y = F.linear(x.to(dt), weight.to(dt))
    return y if add is None else y + add
