"""Model configuration for the K3 family: `kimi_linear` plus the K3 extensions, each switched by a field.

Parsed from a Hugging Face config.json (`kimi_linear` naming, transformers' attribute names, or K3's
`text_config` nesting) or built from a preset (presets.py). Every check names the offending field.
"""

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

# transformers' KimiLinearConfig attribute names -> checkpoint (Moonshot) names
_ALIASES = {
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
    "norm_topk_prob": "moe_renormalize",
    "n_group": "num_expert_group",
    "max_position_embeddings": "model_max_length",
}


class ConfigError(ValueError):
    """A config field is missing, mistyped or inconsistent; the message names it."""


@dataclass(frozen=True)
class MXFP4Config:
    """Routed experts stored as compressed-tensors `mxfp4-pack-quantized`, group 32."""

    group_size: int = 32
    targets: tuple[str, ...] = ("experts",)


@dataclass(frozen=True)
class K3Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    # 1-based layer numbers, as in checkpoints
    kda_layers: tuple[int, ...]
    full_attn_layers: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    model_max_length: int = 1 << 20
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # dense FFN (layers < first_k_dense_replace) and activation
    first_k_dense_replace: int = 1
    intermediate_size: int = 0
    hidden_act: str = "silu"
    activation_situ_beta: float = 4.0
    activation_situ_linear_beta: float = 25.0
    # KDA
    linear_num_heads: int = 0
    linear_head_dim: int = 0
    short_conv_kernel_size: int = 4
    use_full_rank_gate: bool = False
    gate_lower_bound: float | None = None
    # MLA (NoPE)
    num_attention_heads: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_use_nope: bool = True
    mla_use_output_gate: bool = False
    # MoE / LatentMoE
    num_experts: int = 0
    num_experts_per_token: int = 1
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    moe_renormalize: bool = True
    num_expert_group: int = 1
    topk_group: int = 1
    routed_expert_hidden_size: int | None = None
    latent_moe_use_norm: bool = False
    # attention residuals (None: plain residual stream)
    attn_res_block_size: int | None = None
    quantization: MXFP4Config | None = None
    model_type: str = "kimi_linear"
    # checkpoint naming: "kimi_linear" (model.*) or "k3" (language_model.model.*)
    weight_layout: str = "kimi_linear"
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        self.validate()

    # ---- derived values
    def is_kda(self, layer: int) -> bool:
        """layer is 0-based."""
        return (layer + 1) in self.kda_layers

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and self.num_experts > 0

    @property
    def kda_layer_ids(self) -> list[int]:
        return [l for l in range(self.num_hidden_layers) if self.is_kda(l)]

    @property
    def mla_layer_ids(self) -> list[int]:
        return [l for l in range(self.num_hidden_layers) if not self.is_kda(l)]

    @property
    def kv_latent_dim(self) -> int:
        """Cached values per token per MLA layer (576 in K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def conv_dim(self) -> int:
        return 3 * self.linear_num_heads * self.linear_head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return (self.eos_token_id,) if isinstance(self.eos_token_id, int) else tuple(self.eos_token_id)

    def replace(self, **kw) -> "K3Config":
        return dataclasses.replace(self, **kw)

    # ---- validation
    def validate(self):
        for f in dataclasses.fields(self):
            if not _type_ok(getattr(self, f.name), f.type):
                raise ConfigError(f"config field {f.name!r} = {getattr(self, f.name)!r}: expected {f.type}")

        def need(name, ok, why):
            if not ok:
                raise ConfigError(f"config field {name!r} = {getattr(self, name, None)!r}: {why}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers"):
            need(name, isinstance(getattr(self, name), int) and getattr(self, name) > 0, "must be a positive integer")
        n = self.num_hidden_layers
        layers = sorted(self.kda_layers + self.full_attn_layers)
        need("kda_layers", layers == list(range(1, n + 1)),
             f"kda_layers and full_attn_layers (1-based) must together list layers 1..{n} exactly once")
        if self.kda_layers:
            need("linear_num_heads", self.linear_num_heads > 0, "KDA layers need heads")
            need("linear_head_dim", self.linear_head_dim > 0, "KDA layers need a head dim")
            need("short_conv_kernel_size", self.short_conv_kernel_size >= 1, "must be >= 1")
            need("gate_lower_bound", self.gate_lower_bound is None or self.gate_lower_bound < 0,
                 "the safe gate's lower bound must be negative")
        if self.full_attn_layers:
            for name in ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
                need(name, getattr(self, name) > 0, "MLA layers need it positive")
            need("mla_use_nope", self.mla_use_nope, "only NoPE MLA (no rotary embedding) is supported")
        need("hidden_act", self.hidden_act in ("silu", "situ"), "must be 'silu' or 'situ'")
        if self.first_k_dense_replace > 0:
            need("intermediate_size", self.intermediate_size > 0, "dense FFN layers need it positive")
        if self.num_experts:
            need("num_experts_per_token", 1 <= self.num_experts_per_token <= self.num_experts,
                 "must be between 1 and num_experts")
            need("moe_intermediate_size", self.moe_intermediate_size > 0, "MoE layers need it positive")
            need("num_expert_group", self.num_experts % self.num_expert_group == 0,
                 "must divide num_experts")
        need("attn_res_block_size", self.attn_res_block_size is None or self.attn_res_block_size >= 1,
             "must be None or >= 1")
        need("weight_layout", self.weight_layout in ("kimi_linear", "k3"), "must be 'kimi_linear' or 'k3'")

    # ---- Hugging Face config.json
    @classmethod
    def from_hf_dict(cls, raw: dict) -> "K3Config":
        raw = dict(raw)
        layout = "kimi_linear"
        if "text_config" in raw:
            text = dict(raw.pop("text_config"))
            layout = "k3"
            for key in ("quantization_config", "tie_word_embeddings"):
                if key in raw and key not in text:
                    text[key] = raw[key]
            raw = text
        for old, new in _ALIASES.items():
            if old in raw and new not in raw:
                raw[new] = raw.pop(old)
        lin = dict(raw.pop("linear_attn_config", None) or {})
        n = _get(raw, "num_hidden_layers", int)
        kda, full = lin.get("kda_layers"), lin.get("full_attn_layers")
        if kda is None and full is None and raw.get("layer_types"):
            types = raw["layer_types"]
            kda = [i + 1 for i, t in enumerate(types) if t == "linear_attention"]
            full = [i + 1 for i, t in enumerate(types) if t == "full_attention"]
        if kda is None and full is None:
            kda, full = [], list(range(1, n + 1))
        first_dense = raw.get("first_k_dense_replace")
        if first_dense is None and raw.get("mlp_layer_types"):
            types = raw["mlp_layer_types"]
            first_dense = next((i for i, t in enumerate(types) if t != "dense"), len(types))
        quant = raw.get("quantization_config")
        kw = dict(
            vocab_size=_get(raw, "vocab_size", int),
            hidden_size=_get(raw, "hidden_size", int),
            num_hidden_layers=n,
            kda_layers=tuple(_as_int_list(kda, "linear_attn_config.kda_layers")),
            full_attn_layers=tuple(_as_int_list(full, "linear_attn_config.full_attn_layers")),
            first_k_dense_replace=1 if first_dense is None else int(first_dense),
            linear_num_heads=int(lin.get("num_heads", raw.get("linear_num_heads", 0)) or 0),
            linear_head_dim=int(lin.get("head_dim", raw.get("linear_head_dim", 0)) or 0),
            short_conv_kernel_size=int(lin.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4))),
            use_full_rank_gate=bool(lin.get("use_full_rank_gate", False)),
            gate_lower_bound=lin.get("gate_lower_bound"),
            quantization=_parse_quant(quant) if quant else None,
            model_type=str(raw.get("model_type", "kimi_linear")),
            weight_layout=layout,
        )
        eos = raw.get("eos_token_id")
        if isinstance(eos, list):
            raw["eos_token_id"] = tuple(eos)
        names = {f.name for f in dataclasses.fields(cls)} - set(kw) - {"extra", "quantization"}
        for name in names:
            if name in raw and raw[name] is not None:
                kw[name] = raw[name]
        if kw.get("q_lora_rank") is None and "q_lora_rank" in raw:
            kw["q_lora_rank"] = None
        try:
            return cls(**kw, extra={k: v for k, v in raw.items() if k not in names})
        except TypeError as e:
            raise ConfigError(str(e)) from None

    @classmethod
    def from_json(cls, path: str | Path) -> "K3Config":
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict:
        """config.json content in the checkpoint's own naming."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("kda_layers", "full_attn_layers", "linear_num_heads", "linear_head_dim",
                    "short_conv_kernel_size", "use_full_rank_gate", "gate_lower_bound", "extra",
                    "quantization", "weight_layout"):
            d.pop(key)
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        d["linear_attn_config"] = {
            "kda_layers": list(self.kda_layers),
            "full_attn_layers": list(self.full_attn_layers),
            "num_heads": self.linear_num_heads,
            "head_dim": self.linear_head_dim,
            "short_conv_kernel_size": self.short_conv_kernel_size,
            "use_full_rank_gate": self.use_full_rank_gate,
            "gate_lower_bound": self.gate_lower_bound,
        }
        if self.quantization is not None:
            d["quantization_config"] = {
                "quant_method": "compressed-tensors",
                "format": "mxfp4-pack-quantized",
                "config_groups": {"group_0": {"targets": list(self.quantization.targets),
                                              "weights": {"num_bits": 4, "group_size": self.quantization.group_size,
                                                          "type": "float"}}},
            }
        d["architectures"] = ["KimiLinearForCausalLM"]
        if self.weight_layout == "k3":
            return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
                    "text_config": d, "tie_word_embeddings": self.tie_word_embeddings}
        return d


def _type_ok(value, annotation) -> bool:
    """A shallow isinstance check against a dataclass annotation (int, float, bool, X | None, tuple, dict)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return any(_type_ok(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin = typing.get_origin(annotation) or annotation
    return isinstance(value, origin) if isinstance(origin, type) else True


def _get(raw: dict, name: str, typ):
    if name not in raw:
        raise ConfigError(f"config field {name!r} is missing")
    value = raw[name]
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config field {name!r} = {value!r}: must be an integer")
    return value


def _as_int_list(value, name: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"config field {name!r} = {value!r}: must be a list of 1-based layer numbers")
    return list(value)


def _parse_quant(q: dict) -> MXFP4Config:
    fmt = q.get("format") or q.get("quant_method")
    groups = q.get("config_groups") or {}
    size = 32
    for g in groups.values():
        size = int((g.get("weights") or {}).get("group_size", size))
    if fmt not in ("mxfp4-pack-quantized", "mxfp4") and "mxfp4" not in str(q).lower():
        raise ConfigError(f"config field 'quantization_config' format {fmt!r}: only MXFP4 experts are supported")
    if size != 32:
        raise ConfigError(f"config field 'quantization_config' group_size = {size}: MXFP4 uses groups of 32")
    return MXFP4Config(group_size=size)
