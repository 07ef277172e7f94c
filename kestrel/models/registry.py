"""Resolve `--model`: a checkpoint directory, a preset name, or nothing (the bundled k3-small)."""

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.loader import load_model
from kestrel.models.presets import BUNDLED_VOCAB, PRESETS, init_random, preset_config

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUNDLED = ASSETS / "k3-small"


@dataclass
class ResolvedModel:
    model: K3ForCausalLM
    name: str  # what the API reports
    tokenizer_dir: Path | None


def bundled_available() -> bool:
    return (BUNDLED / "config.json").exists()


def resolve(model_path: str | None, dtype: torch.dtype, device, seed: int = 0, progress: bool = True) -> ResolvedModel:
    if model_path is None or (model_path == "k3-small" and bundled_available()):
        if not bundled_available():
            raise FileNotFoundError(f"the bundled model is missing at {BUNDLED}; name a preset or checkpoint")
        return ResolvedModel(load_model(BUNDLED, dtype, device, progress), "k3-small", BUNDLED)
    if model_path in PRESETS:
        if model_path in ("k3", "kimi-linear-48b"):
            raise ValueError(f"preset {model_path!r} is for shape arithmetic only; it is far too large to instantiate")
        cfg = preset_config(model_path)
        model = K3ForCausalLM(cfg, dtype=dtype).to(device)
        init_random(model, seed=seed)
        # the random presets sized to the bundled vocabulary speak through the bundled tokenizer
        tok = BUNDLED if (BUNDLED / "tokenizer.json").exists() and cfg.vocab_size == BUNDLED_VOCAB else None
        return ResolvedModel(model.eval(), model_path, tok)
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model_path!r} is neither a preset ({', '.join(PRESETS)}) nor a directory")
    tok = path if (path / "tokenizer.json").exists() else None
    return ResolvedModel(load_model(path, dtype, device, progress), path.name, tok)
