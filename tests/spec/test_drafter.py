import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.presets import init_random, preset_config
from kestrel.spec.distill import (DistillArgs, batch_rows, calibration, measure_acceptance, measure_acceptance_online,
                                  split_rows, teacher_forced_stats, train_drafter)
from kestrel.spec.distill_data import label_sequences
from kestrel.ops.dspark.reference import rms
from kestrel.spec import drafter as drafter_module
from kestrel.spec.drafter import DSparkConfig, DSparkDrafter, default_feature_layers

SMALL = dict(target_hidden_size=32, feature_layers=(0, 2), vocab_size=96, hidden_size=24, num_layers=2,
             num_heads=2, intermediate_size=32, correction_size=32, confidence_size=16, gamma_max=6)


def small_drafter(seed=0, dtype=torch.float32, **kw) -> DSparkDrafter:
    d = DSparkDrafter(DSparkConfig(**{**SMALL, **kw}), dtype=dtype)
    d.reset_parameters(seed)
    with torch.no_grad():
        d.embed_tokens.weight.copy_(torch.randn(d.embed_tokens.weight.shape, generator=torch.Generator().manual_seed(9)))
        # residual outputs, the correction and the confidence head start at zero: give them weights so tests
        # see every part act
        g = torch.Generator().manual_seed(7)
        for p in d.parameters():
            if not p.any():
                p.normal_(0, 0.3, generator=g)
    return d.eval()


def inputs(d: DSparkDrafter, B=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, d.cfg.feature_size, generator=g) * 3,
            torch.randint(0, d.cfg.vocab_size, (B,), generator=g))


def test_shapes_greedy_is_argmax_and_confidence_range():
    d = small_drafter()
    f, last = inputs(d)
    out = d.propose(f, last, 4)
    assert out.tokens.shape == (5, 4) and out.tokens.dtype == torch.long
    assert out.probs.shape == (5, 4, 96) and out.probs.dtype == torch.float32
    assert out.confidence.shape == (5, 4)
    assert torch.allclose(out.probs.sum(-1), torch.ones(5, 4), atol=1e-5)
    assert torch.equal(out.tokens, out.probs.argmax(-1))
    assert bool(((out.confidence > 0) & (out.confidence < 1)).all())
    # not degenerate: different sequences and positions draft different tokens
    assert out.tokens.unique().numel() > 3


def test_confidence_once_over_positions_equals_per_position(monkeypatch):
    """propose runs the confidence head once over every drafted position: the same values as the head applied at
    each step to that step's state and logits."""
    d = small_drafter(dtype=torch.float64)
    f, last = inputs(d)
    f = f.double()
    out = d.propose(f, last, 5, want_probs=False)
    ctx, slots = d.block(f, last, 5)
    state, token, per = ctx, last, []
    for i in range(5):
        state = d.correct(slots[:, i], state, token)
        logits = d.logits(state)
        token = logits.argmax(-1)
        per.append(torch.sigmoid(d.confidence_logit(state, logits)))
    assert torch.allclose(out.confidence, torch.stack(per, 1), rtol=0, atol=1e-12)
    assert d.propose(f, last, 5, want_probs=False, want_confidence=False).confidence is None
    # the first position's only (the context lookup's gate), on the CPU's folded path and on the module loop
    for fold in (True, False):
        monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", fold)
        first = d.propose(f, last, 5, want_probs=False, confidence_positions=1)
        whole = d.propose(f, last, 5, want_probs=False)
        assert first.confidence.shape == (f.shape[0], 1) and torch.equal(first.tokens, whole.tokens)
        assert torch.allclose(first.confidence[:, 0], whole.confidence[:, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_drafts_through_the_ops_equal_the_loop(dtype, monkeypatch):
    """A GPU's greedy drafts (no distributions, no confidence) go through the correction ops and the block through
    kestrel's linear ops; with the reference ops (the CPU) that path gives the same tokens, and the same block
    outputs bit for bit, as propose's loop and the module formulas."""
    monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", False)  # the CPU's folded products round otherwise
    monkeypatch.setattr(drafter_module, "FOLD_GPU_HEAD", False)  # (its folded head too: tested below)
    d = small_drafter(dtype=dtype)
    f, last = inputs(d, B=16)
    f = f.to(dtype)
    loop = d.propose(f, last, 6, want_probs=False, want_confidence=False)
    assert loop.probs is None and loop.confidence is None
    with torch.no_grad():
        assert torch.equal(d._greedy_drafts(f, last, 6).tokens, loop.tokens)
        # the context lookup's gate: the first position's confidence on the same path, as propose's loop rates it
        first = d._greedy_drafts(f, last, 6, first_confidence=True)
        rated = d.propose(f, last, 6, want_probs=False, confidence_positions=1).confidence
        assert torch.equal(first.tokens, loop.tokens) and first.confidence.shape == (16, 1)
        torch.testing.assert_close(first.confidence, rated, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)
        x = torch.randn(16, 7, d.cfg.hidden_size, dtype=dtype)
        for layer in d.layers:
            assert torch.equal(layer._draft_forward(x), layer(x))


@pytest.mark.parametrize("width", [24, 32])  # 24: an output projection to the target's width; 32: none
def test_folded_gpu_head_drafts_equal_the_loop(width, monkeypatch):
    """GPU greedy drafting folds the output norm's weight and projection into the vocabulary projection, whose op
    normalises the state itself (three ops a position). At float64 it drafts the module loop's tokens and first
    confidences; the fold follows a weight changed in place, into the same tensor (captured graphs read it)."""
    monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", False)
    d = small_drafter(dtype=torch.float64, hidden_size=width)
    assert (d.out_proj is None) == (width == d.cfg.target_hidden_size)
    with torch.no_grad():
        d.out_norm.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    f, last = inputs(d, B=32)
    f = f.double()
    with torch.no_grad():
        for step in range(2):
            loop = d.propose(f, last, 6, want_probs=False, confidence_positions=1)
            for folded in (True, False):
                monkeypatch.setattr(drafter_module, "FOLD_GPU_HEAD", folded)
                got = d._greedy_drafts(f, last, 6, first_confidence=True)
                assert torch.equal(got.tokens, loop.tokens)
                torch.testing.assert_close(got.confidence, loop.confidence, rtol=0, atol=1e-12)
            if step == 0:  # a changed output norm: the next drafts read it, through the same folded tensor
                head = d._folded(drafter_module.FoldedHead).head
                before = head.clone()
                d.out_norm.mul_(torch.linspace(0.2, 3.0, d.out_norm.numel(), dtype=torch.float64))
        assert d._folded(drafter_module.FoldedHead).head is head and not torch.equal(head, before)


@pytest.mark.parametrize("width", [24, 32])  # 24: an output projection to the target's width; 32: none
def test_folded_cpu_drafts_equal_the_loop(width, monkeypatch):
    """CPU greedy drafting regroups the correction's and the head's products (FoldedCorrection). At float64 it
    drafts the tokens of the module formulas' loop, with their confidences; at float32 the logits agree to
    rounding."""
    d = small_drafter(dtype=torch.float64, hidden_size=width)
    assert (d.out_proj is None) == (width == d.cfg.target_hidden_size)
    with torch.no_grad():
        d.out_norm.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))  # folded into the head
    f, last = inputs(d, B=32)
    f = f.double()
    fast = d.propose(f, last, 6, want_probs=False)
    monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", False)
    loop = d.propose(f, last, 6, want_probs=False)
    assert torch.equal(fast.tokens, loop.tokens) and fast.probs is None
    assert torch.allclose(fast.confidence, loop.confidence, rtol=0, atol=1e-12)
    # the logits themselves, fed the loop's tokens, at float32
    d = d.float()
    ctx, slots = d.block(f.float(), last, 6)
    state = d.correct(slots[:, 0], ctx, last)
    fold = d._folded()
    eps = d.cfg.rms_norm_eps
    a = torch.addmm((rms(slots[:, 0], eps) @ fold.slot_up) + fold.token_up[last], rms(ctx, eps), fold.state_up)
    mine = torch.addmm(slots[:, 0], torch.nn.functional.silu(a), fold.down)
    assert torch.allclose(mine, state, rtol=1e-5, atol=1e-5)
    assert torch.allclose(rms(mine, eps) @ fold.head, d.logits(state), rtol=1e-4, atol=1e-4)


def test_folded_products_follow_the_weights(monkeypatch):
    """The folded products are made again when a weight they come from changes in place or is replaced."""
    d = small_drafter(dtype=torch.float64)
    f, last = inputs(d, B=32)
    f = f.double()

    def both():
        monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", True)
        fast = d.propose(f, last, 5, want_probs=False, want_confidence=False).tokens
        monkeypatch.setattr(drafter_module, "FOLD_CPU_DRAFTS", False)
        return fast, d.propose(f, last, 5, want_probs=False, want_confidence=False).tokens

    before = both()[0]
    with torch.no_grad():
        d.corr_up.weight.mul_(-3.0)
        d.out_norm.add_(torch.randn(d.out_norm.shape, dtype=torch.float64))
    fast, loop = both()
    assert torch.equal(fast, loop) and not torch.equal(fast, before)
    with torch.no_grad():
        d.lm_head.weight = d.embed_tokens.weight = torch.nn.Parameter(torch.randn_like(d.embed_tokens.weight))
    fast, loop = both()
    assert torch.equal(fast, loop)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_correction_norms_in_one_call_equal_a_norm_per_part(dtype):
    """rms_rows (the correction's three input norms as one call) gives the bits of one norm per part, gradients
    included (training runs the same correction)."""
    from kestrel.ops.dspark.reference import rms, rms_rows

    gen = torch.Generator().manual_seed(3)
    parts = [(torch.randn(5, d, generator=gen) * s).to(dtype).requires_grad_()
             for d, s in ((24, 0.1), (24, 1.0), (16, 30.0))]  # the embedding may be narrower than the slots
    got = rms_rows(parts, 1e-5)
    want = torch.cat([rms(p, 1e-5) for p in parts], -1)
    assert torch.equal(got, want)
    g = torch.randn(got.shape, generator=gen).to(dtype)
    a = torch.autograd.grad(got, parts, g)
    b = torch.autograd.grad(want, parts, g)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_block_is_causal_and_correction_reads_previous_tokens():
    d = small_drafter()
    f, last = inputs(d)
    long, short = d.propose(f, last, 6), d.propose(f, last, 3)
    # slot i sees slots < i only: a shorter block is a prefix of the longer one
    assert torch.equal(long.tokens[:, :3], short.tokens)
    assert torch.allclose(long.probs[:, :3], short.probs, atol=1e-6)
    # the teacher-forced training forward fed the drafted tokens reproduces the drafting distributions
    logits, conf = d(f, last, long.tokens)
    assert torch.allclose(torch.softmax(logits, -1), long.probs, atol=1e-5)
    assert torch.allclose(torch.sigmoid(conf), long.confidence, atol=1e-5)
    # feeding other previous tokens changes positions >= 2 and leaves position 1 alone
    other = (long.tokens + 1) % 96
    logits2, _ = d(f, last, other)
    assert torch.allclose(logits2[:, 0], logits[:, 0])
    assert not torch.allclose(logits2[:, 1:], logits[:, 1:], atol=1e-3)


def test_sampling_is_seeded_and_uses_the_returned_distribution():
    d = small_drafter()
    f, last = inputs(d, B=64)
    a = d.propose(f, last, 4, temperature=1.5, generator=torch.Generator().manual_seed(3))
    b = d.propose(f, last, 4, temperature=1.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, b.tokens)
    greedy = d.propose(f, last, 4)
    assert not torch.equal(a.tokens, greedy.tokens)
    # first position: the tempered softmax of the same logits as greedy's
    tempered = torch.softmax(torch.log(greedy.probs[:, 0]) / 1.5, -1)
    assert torch.allclose(a.probs[:, 0], tempered, atol=1e-5)
    assert bool((a.probs.gather(-1, a.tokens[..., None]) > 0).all())
    with pytest.raises(ValueError, match="gamma"):
        d.propose(f, last, 7)
    with pytest.raises(ValueError, match="features"):
        d.propose(f[:, 1:], last, 2)


def test_bf16_matches_fp32():
    d = small_drafter()
    f, last = inputs(d, B=32)
    ref = d.propose(f, last, 3)
    out = small_drafter().to(torch.bfloat16).propose(f, last, 3)
    assert out.probs.dtype == torch.float32 and out.tokens.dtype == torch.long
    assert torch.equal(out.tokens, out.probs.argmax(-1))
    assert (out.tokens[:, 0] == ref.tokens[:, 0]).float().mean() > 0.8
    assert (out.probs[:, 0] - ref.probs[:, 0]).abs().max() < 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    d = small_drafter()
    f, last = inputs(d, B=16)
    ref = d.propose(f, last, 4)
    out = d.to("cuda").propose(f.cuda(), last.cuda(), 4)
    assert out.tokens.device.type == "cuda"
    assert torch.allclose(out.probs.cpu(), ref.probs, atol=1e-4)
    # the greedy drafts of the serving loop: the block's rows on the GEMV, the corrections as kernels
    fast = d.propose(f.cuda(), last.cuda(), 4, want_probs=False, want_confidence=False)
    assert torch.equal(fast.tokens.cpu(), ref.tokens)


def test_save_load_round_trip(tmp_path):
    d = small_drafter()
    f, last = inputs(d)
    d.save(tmp_path / "fp32", dtype=None)
    e = DSparkDrafter.load(tmp_path / "fp32")
    a, b = d.propose(f, last, 5), e.propose(f, last, 5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.probs, b.probs)
    assert torch.equal(a.confidence, b.confidence)
    config = json.loads((tmp_path / "fp32" / "config.json").read_text())
    assert config["model_type"] == "dspark" and config["feature_layers"] == [0, 2]
    # the tied lm_head is stored once and comes back tied and frozen
    with safe_open(tmp_path / "fp32" / "model.safetensors", "pt") as fh:
        assert "lm_head.weight" not in fh.keys()
    assert e.lm_head.weight is e.embed_tokens.weight and not e.lm_head.weight.requires_grad
    # bf16 on disk (the default): the loaded model equals the original with bf16-rounded weights
    d.save(tmp_path / "bf16")
    rounded = small_drafter()
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.bfloat16().float())
    c, r = DSparkDrafter.load(tmp_path / "bf16").propose(f, last, 5), rounded.propose(f, last, 5)
    assert torch.equal(c.probs, r.probs)


def test_load_names_a_bad_tensor(tmp_path):
    d = small_drafter()
    d.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 40}))
    with pytest.raises(ValueError, match=r"drafter tensor '[\w.]+': checkpoint shape"):
        DSparkDrafter.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = load_file(tmp_path / "model.safetensors")
    del state["slots"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="missing \\['slots'\\]"):
        DSparkDrafter.load(tmp_path)


def test_feature_layers_and_from_target():
    assert default_feature_layers(8) == (1, 3, 5, 7)
    assert default_feature_layers(4) == (0, 1, 2, 3)
    target = K3ForCausalLM(preset_config("k3-tiny"))
    init_random(target, seed=0)
    d = DSparkDrafter.from_target(target, hidden_size=32, intermediate_size=32, correction_size=32)
    assert d.cfg.feature_layers == (0, 1, 2, 3) and d.cfg.feature_size == 4 * 64
    assert torch.equal(d.embed_tokens.weight, target.model.embed_tokens.weight)
    # k3-tiny does not tie its embeddings: both copies come along, frozen
    assert not d.cfg.tie_word_embeddings and torch.equal(d.lm_head.weight, target.lm_head.weight)
    frozen = d.embed_tokens.weight.numel() + d.lm_head.weight.numel()
    assert d.num_trainable_parameters() == sum(p.numel() for p in d.parameters()) - frozen
    with pytest.raises(ValueError, match="feature layers"):
        DSparkDrafter.from_target(target, feature_layers=(1, 9))


# ---- distillation on a tiny random target

@pytest.fixture(scope="module")
def tiny_run():
    """k3-tiny (random, fp32) continues 10 random prompts greedily; a tiny drafter overfits their rows."""
    torch.manual_seed(0)
    target = K3ForCausalLM(preset_config("k3-tiny")).eval()
    init_random(target, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4096, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (10,), generator=g)]
    drafter = DSparkDrafter.from_target(target, hidden_size=32, num_layers=1, intermediate_size=64,
                                        correction_size=64, gamma_max=4)
    # an untrained drafter still yields the target's greedy continuations (verification is lossless)
    gen = measure_acceptance_online(target, drafter, prompts, gamma=4, max_new_tokens=29)["sequences"]
    stop = (2,)
    ended = [s[-1] in stop for s in gen]
    data = label_sequences(target, gen, [len(p) for p in prompts], ["code"] * len(gen), ended,
                           drafter.cfg.feature_layers, gamma=4)
    every = torch.arange(data.num_rows)
    before = teacher_forced_stats(drafter.eval(), data, every, gamma=4)
    args = DistillArgs(steps=150, batch_size=64, lr=1e-2, warmup_steps=10, progress=False, gamma=4, eval_gamma=4)
    summary = train_drafter(drafter, data, args, torch.device("cpu"))
    after = teacher_forced_stats(drafter, data, every, gamma=4)
    return target, drafter, prompts, gen, data, before, after, summary


def test_label_rows(tiny_run):
    target, drafter, prompts, gen, data, *_ = tiny_run
    assert data.cut == 0 and data.sequences == gen
    assert len(data.offsets) == len(gen) + 1
    j = 3
    row = data.offsets[j] + 2  # t = prompt_len + 1
    t, s = len(prompts[j]) + 1, gen[j]
    assert data.last_token[row] == s[t + 1]
    expect = (s + [-1] * 4)[t + 2 : t + 6]
    assert data.targets[row].tolist() == expect
    # the features are the target's captured layer outputs at t
    from kestrel.models.forward_batch import ForwardBatch

    fb = ForwardBatch.full_sequences([s])
    fb.capture_layers = drafter.cfg.feature_layers
    with torch.no_grad():
        out = target(fb)
    assert torch.allclose(data.features[row], drafter.gather_features(out.captured)[t], atol=1e-5)


def test_label_cuts_where_the_reference_disagrees(tiny_run):
    target, drafter, prompts, gen, *_ = tiny_run
    bad = [list(s) for s in gen[:2]]
    p = len(prompts[1])
    bad[1][p + 5] = (bad[1][p + 5] + 1) % 4096
    data = label_sequences(target, bad, [len(x) for x in prompts[:2]], ["code"] * 2, [True, True],
                           drafter.cfg.feature_layers, gamma=4)
    assert data.cut == 1 and data.sequences[1] == bad[1][: p + 5] and data.ended == [True, False]
    assert data.offsets[2] - data.offsets[1] == 5


def test_rows_split_by_sequence_and_batches_are_seeded(tiny_run):
    data = tiny_run[4]
    fit, calib = split_rows(data, 0.2, seed=0)
    assert sorted(fit.tolist() + calib.tolist()) == list(range(data.num_rows))
    owner = torch.repeat_interleave(torch.arange(len(data.sequences)),
                                    torch.tensor(data.offsets[1:]) - torch.tensor(data.offsets[:-1]))
    held = set(owner[calib].tolist())
    assert len(held) == 2 and not held & set(owner[fit].tolist())
    assert torch.equal(batch_rows(7, fit, 16, seed=1), batch_rows(7, fit, 16, seed=1))
    assert set(batch_rows(7, fit, 16, seed=1).tolist()) <= set(fit.tolist())
    assert not torch.equal(batch_rows(7, fit, 16, seed=1), batch_rows(7, fit, 16, seed=2))


def test_distillation_lowers_the_loss(tiny_run):
    *_, before, after, summary = tiny_run
    assert summary["steps"] == 150 and summary["finished"]
    assert after["ce"] < 0.5 * before["ce"], (before, after)
    assert after["accepted"] > before["accepted"] + 0.5


def test_fast_measurement_equals_the_explicit_verify_loop(tiny_run):
    target, drafter, prompts, gen, data, *_ = tiny_run
    fast = measure_acceptance(drafter, data, gamma=4)
    limits = [len(s) - len(p) if not e else 10**9 for s, p, e in zip(gen, prompts, data.ended)]
    online = measure_acceptance_online(target, drafter, prompts, 4, limits, stop_ids=(2,))
    # lossless: the explicit loop commits the target's greedy text (a prefix of it, where the length limit stops
    # drafting before the end)
    for seq, ref, ended in zip(online["sequences"], gen, data.ended):
        assert seq == (ref if ended else ref[: len(seq)])
    assert (fast["verify_steps"], fast["tokens"]) == (online["verify_steps"], online["tokens"])
    # the trained drafter really drafts: more than one token per step on the rows it learnt
    assert fast["mean_accepted_length"] > 1.5
    assert sum(fast["accepted_histogram"]) == fast["verify_steps"]


def test_calibration_table():
    # predicted 0.9 and accepted 9 times in 10; predicted 0.2 and accepted 1 time in 5
    conf = torch.tensor([[0.9, 1.0, 0.0]] * 9 + [[0.9, 0.0, 0.0]] + [[0.2, 1.0, 1.0]] + [[0.2, 0.0, 1.0]] * 4)
    c = calibration(conf, gamma=3)
    assert [r["position"] for r in c["per_position"]] == [1, 2]
    assert c["per_position"][0]["observed"] == 0.9 and c["per_position"][1]["observed"] == 0.2
    assert c["ece"] < 1e-6
    assert sum(b["n"] for b in c["per_bin"]) == 15
