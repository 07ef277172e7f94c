import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kestrel.models.config import ConfigError, K3Config
from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.loader import CheckpointError, load_model, save_checkpoint
from kestrel.models.presets import init_random, preset_config
from kestrel.models.quantize import quantize_experts
from tests.conftest import rel_err

TOKS = torch.randint(0, 4096, (40,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("layout", ["kimi_linear", "k3"])
def test_save_load_round_trip(tiny64, tmp_path, layout):
    model = tiny64
    if layout == "k3":
        model = K3ForCausalLM(tiny64.cfg.replace(weight_layout="k3"), dtype=torch.float64)
        model.load_state_dict(tiny64.state_dict())
    save_checkpoint(model, tmp_path, max_shard_bytes=200_000)
    assert (tmp_path / "model.safetensors.index.json").exists()  # small shards force an index
    names = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    if layout == "k3":
        assert all(n.startswith("language_model.") for n in names)
        assert "language_model.model.layers.1.attn_res_norm.weight" in names
        assert "language_model.model.output_attn_res_proj.weight" in names
        assert json.loads((tmp_path / "config.json").read_text())["text_config"]["num_hidden_layers"] == 4
    else:
        assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in names
    loaded = load_model(tmp_path, dtype=torch.float64, progress=False)
    assert torch.equal(loaded.reference_logits(TOKS), tiny64.reference_logits(TOKS))


def _rewrite(path, fn):
    file = path / "model.safetensors"
    state = load_file(file)
    fn(state)
    save_file(state, file)


def test_loader_errors_name_the_tensor(tiny64, tmp_path):
    save_checkpoint(tiny64, tmp_path)
    _rewrite(tmp_path, lambda s: s.pop("model.layers.0.self_attn.q_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight.*missing"):
        load_model(tmp_path, dtype=torch.float64, progress=False)
    save_checkpoint(tiny64, tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"model.layers.0.self_attn.bogus.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.bogus\.weight'"):
        load_model(tmp_path, dtype=torch.float64, progress=False)
    save_checkpoint(tiny64, tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"model.norm.weight": torch.zeros(65)}))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight'.*\(65,\).*\(64,\)"):
        load_model(tmp_path, dtype=torch.float64, progress=False)
    save_checkpoint(tiny64, tmp_path)
    _rewrite(tmp_path, lambda s: s.pop("model.layers.1.block_sparse_moe.experts.5.w3.weight"))
    with pytest.raises(CheckpointError, match=r"experts\.w3.*experts \[5\] missing"):
        load_model(tmp_path, dtype=torch.float64, progress=False)


@pytest.mark.parametrize("shape", ["flat", "padded", "bad_padding"])
def test_A_log_layouts(tiny64, tmp_path, shape):
    save_checkpoint(tiny64, tmp_path)
    key = "model.layers.0.self_attn.A_log"
    want = tiny64.model.layers[0].self_attn.A_log.detach().clone()

    def edit(s):
        h = s[key].reshape(-1)
        s[key] = {"flat": h, "padded": torch.cat([h, torch.zeros(6, dtype=h.dtype)]),
                  "bad_padding": torch.cat([h, torch.ones(6, dtype=h.dtype)])}[shape]

    _rewrite(tmp_path, edit)
    if shape == "bad_padding":
        with pytest.raises(CheckpointError, match="A_log"):
            load_model(tmp_path, dtype=torch.float64, progress=False)
        return
    m = load_model(tmp_path, dtype=torch.float64, progress=False)
    assert torch.equal(m.model.layers[0].self_attn.A_log, want)


def test_dense_ffn_under_transformers_naming(tiny64, tmp_path):
    save_checkpoint(tiny64, tmp_path)

    def rename(s):
        for p in ("gate", "up", "down"):
            s[f"model.layers.0.block_sparse_moe.{p}_proj.weight"] = s.pop(f"model.layers.0.mlp.{p}_proj.weight")

    _rewrite(tmp_path, rename)
    m = load_model(tmp_path, dtype=torch.float64, progress=False)
    assert torch.equal(m.reference_logits(TOKS), tiny64.reference_logits(TOKS))


def test_mxfp4_experts_load_and_equal_dequantised_reference(tiny64, tmp_path):
    q = quantize_experts(tiny64)
    save_checkpoint(q, tmp_path)
    names = load_file(tmp_path / "model.safetensors")
    assert names["model.layers.1.block_sparse_moe.experts.0.w1.weight_packed"].shape == (32, 16)
    assert names["model.layers.1.block_sparse_moe.experts.0.w1.weight_scale"].dtype == torch.uint8
    loaded = load_model(tmp_path, dtype=torch.float64, progress=False)
    assert loaded.cfg.quantization is not None
    # the reference: the dense model with every expert weight replaced by its dequantised value
    dense = K3ForCausalLM(tiny64.cfg, dtype=torch.float64)
    dense.load_state_dict(tiny64.state_dict())
    with torch.no_grad():
        for layer_q, layer_d in zip(loaded.model.layers, dense.model.layers):
            if hasattr(layer_q, "block_sparse_moe"):
                for n in ("w1", "w2", "w3"):
                    getattr(layer_d.block_sparse_moe.experts, n).copy_(layer_q.block_sparse_moe.experts.dense(n))
    assert rel_err(loaded.reference_logits(TOKS), dense.reference_logits(TOKS)) < 1e-13
    # and quantisation is close to, not equal to, the original
    err = rel_err(loaded.reference_logits(TOKS), tiny64.reference_logits(TOKS))
    assert 0 < err < 1.0


def test_config_errors_name_the_field(tmp_path):
    good = preset_config("k3-tiny").to_hf_dict()
    for field, value, pattern in [
        ("hidden_size", "64", "hidden_size"),
        ("num_experts_per_token", 99, "num_experts_per_token"),
        ("hidden_act", "gelu", "hidden_act"),
    ]:
        with pytest.raises(ConfigError, match=pattern):
            K3Config.from_hf_dict({**good, field: value})
    bad = json.loads(json.dumps(good))
    bad["linear_attn_config"]["kda_layers"] = [1, 2]
    with pytest.raises(ConfigError, match="kda_layers"):
        K3Config.from_hf_dict(bad)
    missing = dict(good)
    missing.pop("vocab_size")
    with pytest.raises(ConfigError, match="vocab_size"):
        K3Config.from_hf_dict(missing)


def test_config_round_trip_and_aliases():
    cfg = preset_config("k3-tiny")
    assert K3Config.from_hf_dict(cfg.to_hf_dict()) == cfg
    k3 = cfg.replace(weight_layout="k3")
    assert "text_config" in k3.to_hf_dict() and K3Config.from_hf_dict(k3.to_hf_dict()) == k3
    hf_names = {**cfg.to_hf_dict(), "num_local_experts": 8, "num_experts_per_tok": 2}
    hf_names.pop("num_experts"), hf_names.pop("num_experts_per_token")
    assert K3Config.from_hf_dict(hf_names).num_experts_per_token == 2


def test_presets_have_the_documented_shapes():
    k3 = preset_config("k3")
    assert k3.num_hidden_layers == 93 and len(k3.full_attn_layers) == 24 and len(k3.kda_layers) == 69
    assert k3.full_attn_layers[-2:] == (92, 93) and k3.kv_latent_dim == 576
    assert k3.num_experts == 896 and k3.num_experts_per_token == 16 and k3.routed_expert_hidden_size == 3584
    mini = preset_config("k3-mini")
    assert mini.linear_head_dim == 128 and mini.kv_latent_dim == 576 and mini.num_experts == 128
    with torch.device("meta"):
        total = sum(p.numel() for p in K3ForCausalLM(preset_config("kimi-linear-48b")).parameters())
    assert 45e9 < total < 52e9


def test_tied_embeddings_survive_loading(tmp_path):
    cfg = preset_config("k3-tiny").replace(tie_word_embeddings=True)
    model = K3ForCausalLM(cfg, dtype=torch.float64)
    init_random(model, seed=3)
    save_checkpoint(model, tmp_path)
    loaded = load_model(tmp_path, dtype=torch.float64, progress=False)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(loaded.reference_logits(TOKS), model.reference_logits(TOKS))
