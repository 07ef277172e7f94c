"""Block attention residuals: a softmax-weighted sum over the completed block sums and the partial sum."""

import torch

from kestrel.ops.kda.reference import state_dtype_for


def attn_res(values: list[torch.Tensor], w: torch.Tensor, eps: float) -> torch.Tensor:
    """values: [B_1, ..., B_n, P], each [T, D]; w [D] the folded site vector (norm weight * proj weight).

    p_i = softmax_i(<RMSNorm(V_i) (no weight), w>); returns sum_i p_i V_i in the inputs' dtype. Runs in fp32.
    Token-local: nothing mixes positions.
    """
    dt = state_dtype_for(values[0].dtype)
    V = torch.stack([v.to(dt) for v in values])  # [n+1, T, D]
    keys = V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + eps)
    p = torch.softmax(keys @ w.to(dt), dim=0)  # [n+1, T]
    return (p.unsqueeze(-1) * V).sum(0).to(values[0].dtype)


def attn_res_norm(values: list[torch.Tensor], w: torch.Tensor, eps: float, norm_weight: torch.Tensor, norm_eps: float):
    """(h, rms_norm(h, norm_weight, norm_eps)) with h = attn_res(values, w, eps): aggregation fused with the pre-norm."""
    from kestrel.ops.norm.reference import rms_norm

    h = attn_res(values, w, eps)
    return h, rms_norm(h, norm_weight, norm_eps)


def attn_res_settle(bank: list[torch.Tensor], partial: torch.Tensor | None, delta: torch.Tensor | None,
                    key_norm: torch.Tensor, key_proj: torch.Tensor, eps: float, norm_weight: torch.Tensor,
                    norm_eps: float):
    """One settle step of the block-AttnRes stream: P' = P + delta (delta alone when P is None; P when delta is),
    then (P', RMSNorm(attn_res(bank + [P'], key_norm * key_proj))). The decoder's per-sublayer step, one kernel on
    GPU."""
    if delta is not None:
        partial = delta if partial is None else partial + delta
    return partial, attn_res_norm(bank + [partial], key_norm * key_proj, eps, norm_weight, norm_eps)[1]
