"""MXFP4 (OCP Microscaling): blocks of 32 E2M1 values sharing one E8M0 scale 2^(e - 127).

E2M1 nibble: bit 3 is the sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}. Two values per byte, the even input
column in the low nibble. Layouts:
- compressed-tensors (K3): `weight_packed` uint8 [out, in / 2], `weight_scale` uint8 [out, in / 32];
- gpt-oss: `*_blocks` uint8 [out, in / 32, 16], `*_scales` uint8 [out, in / 32].
Both hold the same bytes in the same order; only the shape differs.
"""

import torch

BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# E2M1 has emax = 2: a block's shared exponent is floor(log2(amax)) - 2 so the largest element lands in [4, 8)
E2M1_EMAX = 2


def e2m1_table(dtype=torch.float32, device=None) -> torch.Tensor:
    """All 16 nibble values, index = nibble."""
    pos = torch.tensor(E2M1_VALUES, dtype=dtype, device=device)
    return torch.cat([pos, -pos])


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] (in % 32 == 0) -> (packed uint8 [out, in / 2], scales uint8 [out, in / 32]), round to nearest."""
    out_f, in_f = w.shape
    if in_f % BLOCK:
        raise ValueError(f"MXFP4 needs the input width to be a multiple of {BLOCK}, got {in_f}")
    blocks = w.detach().to(torch.float32).reshape(out_f, in_f // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - E2M1_EMAX, torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    scaled = blocks / torch.exp2(exp)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    # nearest representable magnitude, ties to the even mantissa (OCP round-to-nearest-even); beyond 6 saturates
    dist = (scaled.abs().unsqueeze(-1) - table).abs()
    odd = torch.arange(8, device=w.device) & 1
    idx = torch.where(dist == dist.amin(-1, keepdim=True), odd, 2).argmin(-1)
    nib = (idx | ((scaled < 0) & (idx > 0)).to(idx.dtype) << 3).to(torch.uint8).reshape(out_f, in_f)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    return packed, scales


def dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """(packed uint8 [out, in / 2], scales uint8 [out, in / 32]) -> [out, in] in dtype."""
    out_f = packed.shape[0]
    packed = packed.view(torch.uint8)
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(out_f, -1)
    vals = e2m1_table(torch.float32, packed.device)[nib.long()]
    scale = torch.exp2(scales.view(torch.uint8).to(torch.float32) - 127.0)
    return (vals.view(out_f, -1, BLOCK) * scale.unsqueeze(-1)).reshape(out_f, -1).to(dtype)


def from_gpt_oss(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss `_blocks` [..., out, in / 32, 16] -> compressed-tensors `weight_packed` [..., out, in / 2]."""
    return blocks.reshape(*blocks.shape[:-2], -1), scales


def to_gpt_oss(packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return packed.reshape(*packed.shape[:-1], -1, BLOCK // 2), scales
