"""A tiny random Kimi-Linear saved by Hugging Face transformers' own writer loads here and gives its logits."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kestrel.models.loader import load_model  # noqa: E402
from tests.conftest import rel_err  # noqa: E402


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    cfg = KimiLinearConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=16, num_local_experts=8, num_experts_per_tok=2, routed_scaling_factor=2.446,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                            "kda_layers": [1, 2, 3], "full_attn_layers": [4]})
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(cfg)
    with torch.no_grad():
        # transformers initialises these to zero; random values make the test see them
        for name, p in model.named_parameters():
            if name.endswith(("e_score_correction_bias", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
            elif p.dim() >= 2:
                p.normal_(0, 1 / p.shape[-1] ** 0.5)
    path = tmp_path_factory.mktemp("hf_kimi_linear")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_match_transformers(hf_checkpoint, dtype):
    from transformers import KimiLinearForCausalLM

    hf = KimiLinearForCausalLM.from_pretrained(hf_checkpoint, dtype=dtype, experts_implementation="eager").eval()
    ours = load_model(hf_checkpoint, dtype=dtype, progress=False)
    ids = torch.randint(0, 300, (1, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits[0]
    got = ours.reference_logits(ids[0])
    # transformers computes KDA, its router and gated norm in fp32 whatever the model dtype
    assert rel_err(got, want) < 1e-5
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.99
