"""The model's cached forward modes against the single-request full-forward reference (float64)."""

import pytest
import torch

from kestrel.mem.pools import KVPool, Memory, StatePool
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from tests.conftest import rel_err


class Seq:
    """One sequence's pages and state slot in a pair of pools (what the engine's memory manager will own)."""

    def __init__(self, mem: Memory, tokens: list[int], max_len: int = 256):
        self.mem, self.tokens, self.len = mem, tokens, 0
        self.pages = mem.kv.pages.alloc(-(-max_len // mem.page_size))
        self.slot = mem.state.slots.alloc()[0]
        mem.state.poison(self.slot)

    def locs(self, start: int, n: int) -> torch.Tensor:
        pos = torch.arange(start, start + n)
        return torch.tensor(self.pages)[pos // self.mem.page_size] * self.mem.page_size + pos % self.mem.page_size


def run_batch(model, mem, seqs: list[Seq], ns: list[int], mode=ForwardMode.EXTEND):
    ids = torch.tensor([t for s, n in zip(seqs, ns) for t in s.tokens[s.len : s.len + n]])
    pos = torch.cat([torch.arange(s.len, s.len + n) for s, n in zip(seqs, ns)])
    width = max(len(s.pages) for s in seqs)
    table = torch.tensor([s.pages + [0] * (width - len(s.pages)) for s in seqs], dtype=torch.int32)
    fb = ForwardBatch(mode, ids, pos, list(ns), [s.len for s in seqs], mem=mem, page_table=table,
                      out_cache_loc=torch.cat([s.locs(s.len, n) for s, n in zip(seqs, ns)]),
                      state_slots=torch.tensor([s.slot for s in seqs]))
    with torch.no_grad():
        logits = model(fb).logits
    for s, n in zip(seqs, ns):
        s.len += n
    return logits


def make_mem(model, page_size=4, pages=4096, slots=16):
    cfg, dt = model.cfg, torch.float64
    return Memory(KVPool(cfg, pages, page_size, dt, "cpu"), StatePool(cfg, slots, dt, "cpu"))


def tokens(n, seed):
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("page_size,chunk", [(1, 7), (4, 64), (16, 30)])
def test_prefill_then_decode_equals_full_forward(tiny64, page_size, chunk):
    toks = tokens(90, seed=page_size)
    ref = tiny64.reference_logits(toks)
    mem = make_mem(tiny64, page_size)
    s = Seq(mem, toks)
    out = []
    while s.len < 60:
        out.append(run_batch(tiny64, mem, [s], [min(chunk, 60 - s.len)]))
    while s.len < 90:
        out.append(run_batch(tiny64, mem, [s], [1], ForwardMode.DECODE))
    got = torch.cat(out)
    assert rel_err(got, ref) < 1e-12
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_extend_from_restored_state_equals_full_forward(tiny64):
    """A cached prefix (KV pages) plus a state copied into a fresh slot continues exactly."""
    toks = tokens(100, seed=7)
    ref = tiny64.reference_logits(toks)
    mem = make_mem(tiny64)
    a = Seq(mem, toks)
    run_batch(tiny64, mem, [a], [64])
    # a second sequence reuses a's pages for the prefix and a copy of a's state (copy-on-write restore)
    b = Seq(mem, toks)
    b.pages[:16] = a.pages[:16]
    mem.state.copy(a.slot, b.slot)
    b.len = 64
    got = run_batch(tiny64, mem, [b], [36])
    assert rel_err(got, ref[64:]) < 1e-12


def test_packed_batch_equals_each_alone(tiny64):
    lens = [1, 5, 64, 65, 33]
    seqs_toks = [tokens(n + 10, seed=100 + i) for i, n in enumerate(lens)]
    refs = [tiny64.reference_logits(t) for t in seqs_toks]
    mem = make_mem(tiny64)
    seqs = [Seq(mem, t) for t in seqs_toks]
    logits = run_batch(tiny64, mem, seqs, lens)
    # then a mixed step: one more prefill token for some, decode for the rest, as extend
    more = run_batch(tiny64, mem, seqs, [3, 1, 1, 2, 1])
    dec = run_batch(tiny64, mem, seqs, [1] * 5, ForwardMode.DECODE)
    off = off2 = 0
    for i, (n, m) in enumerate(zip(lens, [3, 1, 1, 2, 1])):
        assert rel_err(logits[off : off + n], refs[i][:n]) < 1e-12
        assert rel_err(more[off2 : off2 + m], refs[i][n : n + m]) < 1e-12
        assert rel_err(dec[i], refs[i][n + m]) < 1e-12
        off, off2 = off + n, off2 + m


def test_padded_prefill_groups_equal_the_reference(tiny64, monkeypatch):
    """On the CPU, prefill sequences of similar sizes share one padded attention block (NaN-poisoned pages past
    each sequence's keys must not leak in): every token's logits equal its own full forward."""
    import kestrel.models.mla as mla

    seen = []

    def recording(*a, **kw):
        seen.append(groups := mla.prefill_groups.__wrapped__(*a, **kw))
        return groups

    recording.__wrapped__ = mla.prefill_groups
    monkeypatch.setattr(mla, "prefill_groups", recording)
    first, second = [9, 12, 10, 30, 2], [8, 8, 7, 9, 40]
    seqs_toks = [tokens(a + b + 1, seed=200 + i) for i, (a, b) in enumerate(zip(first, second))]
    refs = [tiny64.reference_logits(t) for t in seqs_toks]
    mem = make_mem(tiny64, page_size=4)
    for buf in mem.kv.buffers.values():
        buf.fill_(float("nan"))  # every row never written is NaN
    seqs = [Seq(mem, t) for t in seqs_toks]
    a = run_batch(tiny64, mem, seqs, first)  # from empty caches
    b = run_batch(tiny64, mem, seqs, second)  # over cached prefixes of different lengths
    assert any(len(g) > 1 for groups in seen for g in groups), seen
    oa = ob = 0
    for i, (n, m) in enumerate(zip(first, second)):
        assert rel_err(a[oa : oa + n], refs[i][:n]) < 1e-12
        assert rel_err(b[ob : ob + m], refs[i][n : n + m]) < 1e-12
        oa, ob = oa + n, ob + m


def test_prefill_groups_cover_every_sequence_once_within_the_padding_bound():
    from kestrel.models.mla import prefill_groups

    gen = torch.Generator().manual_seed(5)
    for _ in range(20):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        ext = torch.randint(1, 300, (n,), generator=gen).tolist()
        keys = [e + int(p) for e, p in zip(ext, torch.randint(0, 500, (n,), generator=gen))]
        groups = prefill_groups(ext, keys, heads=4, cap=1 << 20)
        assert sorted(i for g in groups for i in g) == list(range(n))
        for g in groups:
            padded = len(g) * max(ext[i] for i in g) * max(keys[i] for i in g)
            assert len(g) == 1 or (padded <= 1.25 * sum(ext[i] * keys[i] for i in g) and padded * 4 <= 1 << 20)


def test_snapshot_track_writes_the_state_at_a_grid_point(tiny64):
    """fb.track copies the state after `off` tokens of an extend into another slot (prefix-cache snapshots)."""
    toks = tokens(130, seed=9)
    ref = tiny64.reference_logits(toks)
    mem = make_mem(tiny64)
    a = Seq(mem, toks)
    run_batch(tiny64, mem, [a], [40])
    snap = mem.state.slots.alloc()[0]
    ids = torch.tensor(toks[40:100])
    table = torch.tensor([a.pages], dtype=torch.int32)
    fb = ForwardBatch(ForwardMode.EXTEND, ids, torch.arange(40, 100), [60], [40], mem=mem, page_table=table,
                      out_cache_loc=a.locs(40, 60), state_slots=torch.tensor([a.slot]), track=[(24, snap)])
    with torch.no_grad():
        tiny64(fb)
    # resume from the snapshot at position 64 in a fresh sequence sharing the pages
    b = Seq(mem, toks)
    b.pages[:16] = a.pages[:16]
    mem.state.copy(snap, b.slot)
    b.len = 64
    got = run_batch(tiny64, mem, [b], [66])
    assert rel_err(got, ref[64:]) < 1e-12


def test_state_matters(tiny64):
    """Guard against a test model too weak to notice a wrong state: a foreign state changes the greedy tokens."""
    toks = tokens(80, seed=11)
    mem = make_mem(tiny64)
    a, b = Seq(mem, toks), Seq(mem, tokens(80, seed=12))
    run_batch(tiny64, mem, [a], [64])
    run_batch(tiny64, mem, [b], [64])
    ref = tiny64.reference_logits(toks)[64:].argmax(-1)
    mem.state.copy(b.slot, a.slot)
    got = run_batch(tiny64, mem, [a], [16]).argmax(-1)
    assert (got != ref).sum() >= 4


@pytest.mark.parametrize("preset", ["k3-tiny", "kimi-linear-subset"])
def test_fused_projections_equal_the_separate_layers(preset, monkeypatch):
    """fuse_projections (one GEMM per group of projections sharing an input; KDA's two bottleneck up-projections
    over adjacent columns stacked, on the Kimi-Linear layout whose output gate is low-rank) leaves the model's
    outputs those of the separate layers, and every parameter keeps its value; so does handing the shared experts'
    activation to the routed experts, and KDA's output gate to the decode (which on CPU hand them back undone)."""
    import copy

    from kestrel.models.k3 import K3ForCausalLM
    from kestrel.models.presets import init_random, kimi_linear_subset, preset_config

    cfg = preset_config("k3-tiny")
    if preset != "k3-tiny":
        cfg = kimi_linear_subset(cfg)
        assert not cfg.use_full_rank_gate
    model = K3ForCausalLM(cfg, dtype=torch.float64)
    init_random(model, seed=1)
    fused = copy.deepcopy(model)
    fused.fuse_projections()
    kda = next(layer.self_attn for layer in fused.model.layers if layer.is_kda)
    assert hasattr(kda, "_fused_up") == (preset != "k3-tiny")
    # every fusion stands (none moved another's weights out of its buffer): the MoE front end takes the shared
    # experts' gate and up, and they do not fuse again on their own
    fusions = [m._fused for m in fused.modules() if getattr(m, "_fused", None) is not None]
    assert fusions and all(f.valid() for f in fusions)
    moe = [layer.block_sparse_moe for layer in fused.model.layers if hasattr(layer, "block_sparse_moe")]
    assert all(hasattr(m, "_fused") for m in moe) == (preset == "k3-tiny")
    for (name, a), b in zip(model.state_dict().items(), fused.state_dict().values()):
        assert torch.equal(a, b), name
    # and decode steps through the pools (the fused forward at one row)
    assert_same_outputs(model, fused, tokens(40, seed=2), decode_steps=10)
    from kestrel.ops import kda as kda_ops, moe as moe_ops

    monkeypatch.setattr(moe_ops, "SHARED_ACT_IN_EXPERTS", True)
    monkeypatch.setattr(kda_ops, "OUT_GATE_IN_RECUR", True)
    assert_same_outputs(model, fused, tokens(40, seed=2), decode_steps=3)


def assert_same_outputs(a, b, toks: list[int], decode_steps: int) -> None:
    """a's and b's full-sequence logits of toks agree to 1e-12, and so do a prefill of 30 tokens and then
    decode_steps one-token decodes through the pools."""
    assert rel_err(b.reference_logits(toks), a.reference_logits(toks)) < 1e-12
    mems = [make_mem(m) for m in (a, b)]
    seqs = [Seq(mem, toks) for mem in mems]
    outs = [run_batch(m, mem, [s], [30]) for m, mem, s in zip((a, b), mems, seqs)]
    for _ in range(decode_steps):
        outs = [run_batch(m, mem, [s], [1], ForwardMode.DECODE) for m, mem, s in zip((a, b), mems, seqs)]
        assert rel_err(outs[1], outs[0]) < 1e-12


def test_a_recorded_forward_of_a_trainable_model_takes_the_differentiable_ops(tiny64):
    """The Triton kernels have no backward: a forward that autograd records through trainable weights must run the
    reference ops (forced for the whole forward), and a serving forward (no grad, or frozen weights) must not."""
    import kestrel.ops as ops

    seen = []
    hook = tiny64.model.register_forward_hook(lambda *_: seen.append(ops._FORCE_REFERENCE))
    fb = lambda: ForwardBatch.full_sequences([[5, 6, 7, 8]], device="cpu")  # noqa: E731
    try:
        logits = tiny64(fb()).logits
        assert seen == [True] and logits.requires_grad
        logits.float().sum().backward()
        assert all(p.grad is not None for p in tiny64.model.layers[1].parameters())
        with torch.no_grad():
            tiny64(fb())
        with torch.inference_mode():
            tiny64(fb())
        frozen = [p for p in tiny64.parameters() if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        tiny64(fb())
        for p in frozen:
            p.requires_grad_(True)
        assert seen == [True, False, False, False] and not ops._FORCE_REFERENCE
    finally:
        hook.remove()
        tiny64.zero_grad(set_to_none=True)


def test_kmajor_cpu_layout_keeps_the_model(tiny64):
    """cpu_kmajor_layout stores each linear weight K-major under a transposed view: every parameter keeps its shape
    and value, the outputs keep theirs (to rounding: other products' summation order), and the tied LM head (the
    embedding table) and the per-head-viewed MLA kv_b_proj stay row-major. A CPU engine takes the layout
    (and its drafter)."""
    import copy

    from kestrel import Engine
    from kestrel.models.k3 import K3ForCausalLM
    from kestrel.models.layers.linear import cpu_kmajor_layout
    from kestrel.models.presets import preset_config

    model = copy.deepcopy(tiny64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    moved = cpu_kmajor_layout(model)
    names = {n for n, p in model.named_parameters() if not p.is_contiguous()}
    assert moved == len(names) > 10
    assert all(model.get_parameter(n).t().is_contiguous() for n in names)
    assert "lm_head.weight" in names  # untied here
    assert not any("embed" in n or "kv_b_proj" in n for n in names)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert_same_outputs(tiny64, model, tokens(40, seed=3), decode_steps=5)
    assert cpu_kmajor_layout(model) == 0  # already K-major: nothing moves twice
    tied = K3ForCausalLM(preset_config("k3-tiny", tie_word_embeddings=True), dtype=torch.float64)
    cpu_kmajor_layout(tied)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and tied.lm_head.weight.is_contiguous()
    eng = Engine(model="k3-small", skip_tokenizer_init=True, speculative_algorithm="dspark")
    try:
        for m in (eng.core.runner.model, eng.core.runner.spec.drafter):
            w = [p for n, p in m.named_parameters() if n.endswith(("o_proj.weight", "corr_up.weight"))]
            assert w and all(p.t().is_contiguous() and not p.is_contiguous() for p in w)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("block", [None, 2])
def test_captured_layers_are_the_stream_after_each_layer(block):
    """A captured layer's output (the drafter's features) is the residual stream after that layer: without attention
    residuals, the stream a model of only the first l + 1 layers normalises for its output; and capturing changes
    no logit (the next sublayer's fused settle writes the captured sum; with AttnRes it is the block's partial sum)."""
    from kestrel.models.k3 import K3ForCausalLM
    from kestrel.models.presets import init_random, preset_config
    from kestrel.ops.norm import reference as norm_ref

    cfg = preset_config("k3-tiny", attn_res_block_size=block)
    torch.manual_seed(0)
    model = K3ForCausalLM(cfg, dtype=torch.float64).eval()
    init_random(model, seed=1)
    seq = tokens(11, 3)
    layers = tuple(range(cfg.num_hidden_layers))

    def forward(m, capture):
        fb = ForwardBatch.full_sequences([seq])
        fb.capture_layers = capture
        with torch.no_grad():
            return m(fb)

    out = forward(model, layers)
    assert torch.equal(out.logits, forward(model, ()).logits) and sorted(out.captured) == list(layers)
    if block:
        return
    for l in layers:
        n = l + 1
        kinds = dict(kda_layers=tuple(i for i in cfg.kda_layers if i <= n),
                     full_attn_layers=tuple(i for i in cfg.full_attn_layers if i <= n))
        short = K3ForCausalLM(preset_config("k3-tiny", attn_res_block_size=None, num_hidden_layers=n, **kinds),
                              dtype=torch.float64).eval()
        short.load_state_dict(model.state_dict(), strict=False)
        want = forward(short, ()).hidden
        got = norm_ref.rms_norm(out.captured[l], model.model.norm.weight, cfg.rms_norm_eps)
        assert rel_err(got, want) < 1e-12, l
