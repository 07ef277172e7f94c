"""Named model configurations (`--model PRESET`) and random initialisation for them.

k3-tiny   tests: every feature on, milliseconds on CPU.
k3-small  the bundled default (trained by `kestrel train`; random weights when no checkpoint is bundled).
k3-mini   GPU benchmarks: real kernel shapes (head_dim 128, 576-wide latents), ~1.2 B active parameters.
k3        the full 93-layer shapes (memory arithmetic and shape tests only; never instantiated).
kimi-linear-48b  Kimi-Linear-48B-A3B's shapes.
Shapes marked "assumed" are not public; they are configurable like everything else.
"""

import math

import torch
from torch import nn

from kestrel.models.config import K3Config

BUNDLED_VOCAB = 4096


def _layers(n: int, mla: list[int]) -> dict:
    return {"kda_layers": tuple(l for l in range(1, n + 1) if l not in mla), "full_attn_layers": tuple(mla)}


_K3_EXT = dict(hidden_act="situ", gate_lower_bound=-5.0, use_full_rank_gate=True, mla_use_output_gate=True,
               latent_moe_use_norm=True)

PRESETS: dict[str, dict] = {
    "k3-tiny": dict(
        vocab_size=BUNDLED_VOCAB, hidden_size=64, num_hidden_layers=4, **_layers(4, [2, 4]),
        intermediate_size=128, linear_num_heads=2, linear_head_dim=16,
        num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, num_experts=8, num_experts_per_token=2, moe_intermediate_size=32, num_shared_experts=1,
        routed_scaling_factor=2.5, routed_expert_hidden_size=32, attn_res_block_size=2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, model_max_length=4096, **_K3_EXT),
    "k3-small": dict(
        vocab_size=BUNDLED_VOCAB, hidden_size=256, num_hidden_layers=8, **_layers(8, [4, 8]),
        intermediate_size=768, linear_num_heads=4, linear_head_dim=64,
        num_attention_heads=4, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=64, num_experts=8, num_experts_per_token=2, moe_intermediate_size=192, num_shared_experts=1,
        routed_scaling_factor=2.5, routed_expert_hidden_size=128, attn_res_block_size=2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, model_max_length=4096, tie_word_embeddings=True, **_K3_EXT),
    "k3-mini": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=24, **_layers(24, list(range(4, 25, 4))),
        intermediate_size=8192, linear_num_heads=16, linear_head_dim=128,
        num_attention_heads=16, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, num_experts=128, num_experts_per_token=8, moe_intermediate_size=512, num_shared_experts=2,
        routed_scaling_factor=2.5, routed_expert_hidden_size=1024, attn_res_block_size=4,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, model_max_length=131072, **_K3_EXT),
    # K3: 93 layers, MLA at 4, 8, ..., 92 and 93; 896 experts top-16 in a 3584-wide latent space.
    # KDA/MLA head counts, q_lora_rank, moe_intermediate_size and vocab are assumed (not public).
    "k3": dict(
        vocab_size=163840, hidden_size=7168, num_hidden_layers=93, **_layers(93, list(range(4, 93, 4)) + [93]),
        intermediate_size=18432, linear_num_heads=64, linear_head_dim=128,
        num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, num_experts=896, num_experts_per_token=16, moe_intermediate_size=3072, num_shared_experts=1,
        routed_scaling_factor=2.5, routed_expert_hidden_size=3584, attn_res_block_size=6,
        model_max_length=1 << 20, weight_layout="k3", **_K3_EXT),
    "kimi-linear-48b": dict(
        vocab_size=163840, hidden_size=2304, num_hidden_layers=27, **_layers(27, [4, 8, 12, 16, 20, 24, 27]),
        intermediate_size=9216, linear_num_heads=32, linear_head_dim=128,
        num_attention_heads=32, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, num_experts=256, num_experts_per_token=8, moe_intermediate_size=1024, num_shared_experts=1,
        routed_scaling_factor=2.446, bos_token_id=163584, eos_token_id=163586, pad_token_id=163839,
        model_max_length=1 << 20),
}


def preset_config(name: str, **overrides) -> K3Config:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return K3Config(**{**PRESETS[name], **overrides})


def kimi_linear_subset(cfg: K3Config) -> K3Config:
    """The same sizes with every K3 extension off: the configuration transformers' KimiLinear can run."""
    return cfg.replace(hidden_act="silu", gate_lower_bound=None, use_full_rank_gate=False, mla_use_output_gate=False,
                       routed_expert_hidden_size=None, latent_moe_use_norm=False, attn_res_block_size=None,
                       q_lora_rank=None)


@torch.no_grad()
def init_random(model: nn.Module, seed: int = 0, gain: float = 1.0) -> None:
    """Random weights that keep activations O(1) layer after layer (std gain / sqrt(fan_in)), so every layer and
    every cache path changes the output: a wrong state or page shows up as different tokens in tests."""
    # drawn where the weights live: fp64 on the CPU, fp32 on a GPU (k3-mini's 5 B fp64 draws on a CPU take minutes)
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    draw = torch.float64 if dev.type == "cpu" else torch.float32

    def normal_(t: torch.Tensor, std: float):
        t.copy_(torch.randn(t.shape, generator=gen, device=dev, dtype=draw) * std)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.zero_()
        elif leaf == "dt_bias":
            u = torch.rand(p.shape, generator=gen, device=dev, dtype=draw)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif name.endswith("norm.weight") or leaf == "norm_weight":
            normal_(p, 0.1)
            p.add_(1.0)
        elif leaf == "proj_weight":
            normal_(p, 1.0 / math.sqrt(p.shape[-1]))
        elif "conv1d" in name:
            normal_(p, 1.0 / math.sqrt(p.shape[-1]))
        elif "embed_tokens" in name:
            normal_(p, 1.0)
        elif p.dim() >= 2:
            normal_(p, gain / math.sqrt(p.shape[-1]))
        else:
            normal_(p, 0.02)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            normal_(b, 0.1)
