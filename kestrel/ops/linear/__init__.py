"""Linear y = x W^T, dispatched by device and shape: decode-sized batches (<= GEMV_MAX_M rows) on CUDA take the
Triton GEMV, which streams each weight row once with the rows of x held in registers; everything else (and every
CPU call) is F.linear."""

import torch
import torch.nn.functional as F

from kestrel.ops import kernel
from kestrel.ops.linear import reference

# measured on the H200 with weights streamed from HBM (docs/kernels.md): at one row the GEMV beats cuBLAS by
# 1.1-1.4x; at eight rows cuBLAS (tensor cores) is 2-4x faster
GEMV_MAX_M = 1


def linear(x: torch.Tensor, weight: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ add, a residual of the output's shape) -> [..., N] in the wider of the two
    dtypes (an fp32 router weight reads bf16 activations without a converted copy on the GEMV path; the GEMV adds
    `add` in its epilogue, rounding as the separate add would)."""
    if x.device.type == "cpu" and x.dtype == weight.dtype:  # the reference without its casts and dispatch checks
        y = F.linear(x, weight)  # (~10 us a call on this path, ~100 calls a k3-small token)
        return y if add is None else y + add
    rows = x.numel() // max(1, x.shape[-1])
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if (rows > GEMV_MAX_M or torch.float64 in (x.dtype, weight.dtype) or not weight.is_contiguous()
            or (add is not None and add.dtype != out_dtype)):
        return reference.linear(x, weight, add)
    fn = kernel(__name__ + ".triton", "linear", x)
    if fn is None:
        return reference.linear(x, weight, add)
    shape = (*x.shape[:-1], weight.shape[0])
    return fn(x.reshape(rows, x.shape[-1]), weight,
              None if add is None else add.reshape(rows, weight.shape[0])).view(shape)
