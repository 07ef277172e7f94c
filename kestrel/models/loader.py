"""Hugging Face checkpoint directories: config.json + safetensors shards (+ index) + tokenizer files.

Two naming schemes load into one model (DESIGN §1): `kimi_linear` (model.*, per-expert `experts.{e}.w1|w2|w3`,
dense FFN as `mlp.*` or transformers' `block_sparse_moe.{gate,up,down}_proj`) and the K3 layout
(`language_model.` prefix, `*_res_norm` / `*_res_proj`, MXFP4 experts as `weight_packed` + `weight_scale`).
A tensor that is missing, unexpected or misshaped raises CheckpointError naming it.
"""

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from kestrel.models.config import K3Config
from kestrel.models.k3 import K3ForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")
# checkpoint prefixes that belong to parts this loader does not build (the vision tower, issue-tracked separately)
SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.")

_EXPERT = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.(weight|weight_packed|weight_scale|weight_blocks|weight_scales)$")
_RES = re.compile(r"^(model\.layers\.\d+\.)(attn|mlp)_res_(norm|proj)\.weight$")
_OUT_RES = re.compile(r"^model\.output_attn_res_(norm|proj)\.weight$")
_DENSE_AS_MOE = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.(gate|up|down)_proj\.weight$")


class CheckpointError(ValueError):
    """A checkpoint tensor is missing, unexpected or misshaped; the message names it."""


def canonical_name(name: str, cfg: K3Config) -> str:
    """Checkpoint tensor name -> this model's parameter name (experts handled apart)."""
    if name.startswith("language_model."):
        name = name[len("language_model."):]
    if m := _RES.match(name):
        return f"{m[1]}{m[2]}_res.{m[3]}_weight"
    if m := _OUT_RES.match(name):
        return f"model.output_attn_res.{m[1]}_weight"
    if (m := _DENSE_AS_MOE.match(name)) and not cfg.is_moe(int(m[1])):
        return f"model.layers.{m[1]}.mlp.{m[2]}_proj.weight"
    return name


def checkpoint_name(ours: str, cfg: K3Config) -> str:
    """This model's parameter name -> the name written to checkpoints (inverse of canonical_name)."""
    if m := re.match(r"^(model\.layers\.\d+\.)(attn|mlp)_res\.(norm|proj)_weight$", ours):
        ours = f"{m[1]}{m[2]}_res_{m[3]}.weight"
    elif m := re.match(r"^model\.output_attn_res\.(norm|proj)_weight$", ours):
        ours = f"model.output_attn_res_{m[1]}.weight"
    return "language_model." + ours if cfg.weight_layout == "k3" else ours


def _list_tensors(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: path / shard for name, shard in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    out = {}
    for file in files:
        with safe_open(file, "pt") as f:
            out.update({name: file for name in f.keys()})
    return out


def _fit_A_log(t: torch.Tensor, H: int, name: str) -> torch.Tensor:
    """K3 stores A_log as [H], [1, 1, H, 1] or a longer 1-D tensor whose tail is zero padding."""
    flat = t.reshape(-1)
    if flat.numel() < H or (flat.numel() > H and (t.dim() != 1 or flat[H:].abs().max() != 0)):
        raise CheckpointError(f"tensor {name!r}: shape {tuple(t.shape)} cannot hold {H} per-head decay rates")
    return flat[:H]


def load_state(model: K3ForCausalLM, path: str | Path, progress: bool = True) -> None:
    """Read every tensor of the checkpoint at `path` into `model` (shapes and names checked)."""
    path, cfg = Path(path), model.cfg
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    expected = set(params)
    tensors = _list_tensors(path)
    experts: dict[str, dict[int, torch.Tensor]] = {}
    seen: set[str] = set()
    handles = {}
    names = [n for n in tensors if not n.startswith(SKIPPED_PREFIXES)]
    for name in tqdm(names, desc="loading weights", unit="tensor", disable=not progress, leave=False):
        file = tensors[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        t = handles[file].get_tensor(name)
        ours = canonical_name(name, cfg)
        if m := _EXPERT.match(ours):
            kind = {"weight": "", "weight_packed": "_packed", "weight_scale": "_scale",
                    "weight_blocks": "_packed", "weight_scales": "_scale"}[m[4]]
            if m[4] == "weight_blocks":
                t = t.reshape(t.shape[0], -1)
            experts.setdefault(f"{m[1]}.{m[3]}{kind}", {})[int(m[2])] = t
            continue
        if ours not in params:
            raise CheckpointError(f"unexpected tensor {name!r} in {file.name}: the model has no such weight")
        target = params[ours]
        if ours.endswith("A_log"):
            t = _fit_A_log(t, target.shape[0], name)
        if tuple(t.shape) != tuple(target.shape):
            raise CheckpointError(f"tensor {name!r}: checkpoint shape {tuple(t.shape)}, model expects {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(t)
        seen.add(ours)
    for ours, per_expert in experts.items():
        if ours not in params:
            raise CheckpointError(f"unexpected expert tensors {ours!r}: the model has no such weight "
                                  f"(quantised experts need quantization_config, dense ones must not have it)")
        target = params[ours]
        missing = sorted(set(range(target.shape[0])) - set(per_expert))
        if missing:
            raise CheckpointError(f"tensor {ours!r}: experts {missing[:8]} missing from the checkpoint")
        stacked = torch.stack([per_expert[e] for e in range(target.shape[0])])
        if tuple(stacked.shape) != tuple(target.shape):
            raise CheckpointError(f"tensor {ours!r} (stacked over experts): checkpoint shape {tuple(stacked.shape)}, "
                                  f"model expects {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(stacked.view(target.dtype) if stacked.dtype != target.dtype and target.dtype == torch.uint8 else stacked)
        seen.add(ours)
    if cfg.tie_word_embeddings:
        seen.add("lm_head.weight")
    missing = sorted(expected - seen)
    if missing:
        raise CheckpointError(f"tensor {checkpoint_name(missing[0], cfg)!r} missing from the checkpoint "
                              f"({len(missing)} missing in all)")


def save_checkpoint(model: K3ForCausalLM, path: str | Path, tokenizer_dir: str | Path | None = None,
                    dtype: torch.dtype | None = None, max_shard_bytes: int = 2 << 30) -> None:
    """Write config.json + safetensors shards (+ index when sharded) in the checkpoint naming of model.cfg."""
    path, cfg = Path(path), model.cfg
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for ours, t in list(model.named_parameters()) + list(model.named_buffers()):
        if ours == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = t.detach()
        if dtype is not None and t.is_floating_point() and not _keep_fp32(ours):
            t = t.to(dtype)
        if m := re.match(r"^(.*\.experts)\.(w[123])(_packed|_scale)?$", ours):
            suffix = {None: "weight", "_packed": "weight_packed", "_scale": "weight_scale"}[m[3]]
            for e in range(t.shape[0]):
                state[checkpoint_name(f"{m[1]}.{e}.{m[2]}.{suffix}", cfg)] = t[e].contiguous()
            continue
        if ours.endswith("A_log") and cfg.weight_layout == "kimi_linear":
            t = t.view(1, 1, -1, 1)
        state[checkpoint_name(ours, cfg)] = t.contiguous().cpu()
    shards, current, size = [], {}, 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = state[name].cpu()
        size += nbytes
    shards.append(current)
    for old in path.glob("*.safetensors"):
        old.unlink()
    if len(shards) == 1:
        save_file(shards[0], path / "model.safetensors", metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, path / fname, metadata={"format": "pt"})
            weight_map.update({n: fname for n in shard})
        total = sum(t.numel() * t.element_size() for t in state.values())
        with open(path / "model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = str(dtype or model.dtype).removeprefix("torch.")
    with open(path / "config.json", "w") as f:
        json.dump(hf, f, indent=2)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.exists() and src.resolve() != (path / name).resolve():
                shutil.copy(src, path / name)


def _keep_fp32(name: str) -> bool:
    # router, decay parameters and correction bias stay fp32 in checkpoints, as in Moonshot's
    return name.endswith(("A_log", "dt_bias", "gate.weight", "e_score_correction_bias"))


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device="cpu", progress: bool = True) -> K3ForCausalLM:
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path} has no config.json")
    cfg = K3Config.from_json(path / "config.json")
    with torch.device("meta"):
        model = K3ForCausalLM(cfg, dtype=dtype)
    model = model.to_empty(device=device)
    # NOTE: to_empty gives every parameter its own storage, which unties lm_head from the embedding
    model.tie_weights()
    _reset_nonpersistent(model)
    load_state(model, path, progress=progress)
    return model.eval()


def _reset_nonpersistent(model: K3ForCausalLM) -> None:
    # to_empty leaves garbage everywhere; buffers the checkpoint may omit must start at a defined value
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.zero_()
