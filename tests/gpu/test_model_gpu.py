"""The whole model on CUDA: Triton kernels vs the reference ops (prefill and decode), and the CUDA-graph decode
runner vs eager decode, on k3-small shapes."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _setup(dtype, fuse=False):
    from kestrel.mem.pools import KVPool, Memory, StatePool
    from kestrel.models.k3 import K3ForCausalLM
    from kestrel.models.presets import init_random, preset_config

    cfg = preset_config("k3-small")
    model = K3ForCausalLM(cfg, dtype=dtype)
    init_random(model, seed=0)
    model = model.cuda().eval()
    if fuse:
        model.fuse_projections()
    mem = Memory(KVPool(cfg, 64, 16, dtype, "cuda"), StatePool(cfg, 8, dtype, "cuda"))
    return cfg, model, mem


def _live_sequences(mem, B: int):
    """B sequences with 4 pages and a state slot each, every cache and state filled with random values."""
    pages = [mem.kv.pages.alloc(4) for _ in range(B)]
    slots = mem.state.slots.alloc(B)
    for t in mem.kv.buffers.values():
        t.normal_()
    for t in list(mem.state.conv.values()) + list(mem.state.ssm.values()):
        t.normal_(std=0.1)
    return pages, slots


def _replayed_steps(mem, variants, steps: int):
    """For each (key, setup) of `variants`: setup() switches the variant on and returns the step function (model or
    graph runner); every variant then decodes `steps` batch-1 tokens from the same random caches. Returns
    {key: (stacked logits, every cache and state after)}."""
    from kestrel.models.forward_batch import ForwardBatch, ForwardMode

    ps = mem.kv.page_size
    pages, slots = _live_sequences(mem, 1)
    pt = torch.tensor(pages, dtype=torch.int32, device="cuda")
    tensors = list(mem.state.conv.values()) + list(mem.state.ssm.values()) + list(mem.kv.buffers.values())
    snap = [t.clone() for t in tensors]
    results = {}
    for key, setup in variants:
        step_fn = setup()
        for t, s in zip(tensors, snap):
            t.copy_(s)
        logits = []
        for step, ctx in enumerate(range(40, 40 + steps)):
            fb = ForwardBatch(ForwardMode.DECODE, torch.tensor([5 + step], device="cuda"),
                              torch.tensor([ctx], device="cuda"), [1], [ctx], mem=mem, page_table=pt,
                              out_cache_loc=torch.tensor([pages[0][ctx // ps] * ps + ctx % ps], device="cuda"),
                              state_slots=torch.tensor(slots, device="cuda"))
            logits.append(step_fn(fb).logits.clone())
        results[key] = (torch.stack(logits), [t.clone() for t in tensors])
    return results


def _bit_equal(a, b) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def _graphed(model, mem):
    """The batch-1 decode graph's step function (captured under the current settings)."""
    from kestrel.engine.cuda_graph import DecodeGraphRunner

    runner = DecodeGraphRunner(model, mem, batch_sizes=(1,), max_pages_per_seq=8)
    runner.capture()
    return runner.run


def _checked_then_pdl_graphs(monkeypatch, model, mem, target, name: str, checked, steps: int) -> dict:
    """Steps from the same caches: eagerly with target.name replaced by `checked` (which checks each call), then
    graphed with the original, programmatic dependent launch off and on. Returns _replayed_steps' results under
    the keys "eager", False and True."""
    import kestrel.ops as ops

    original = getattr(target, name)

    def eager():
        monkeypatch.setattr(target, name, checked)
        return model

    def graphed(pdl):
        def setup():
            monkeypatch.setattr(target, name, original)
            monkeypatch.setattr(ops, "PDL", pdl)
            return _graphed(model, mem)
        return setup

    return _replayed_steps(mem, [("eager", eager), (False, graphed(False)), (True, graphed(True))], steps)


def rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm()).item()


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_reference(dtype):
    from kestrel.ops import reference_ops

    cfg, model, _ = _setup(dtype)
    toks = torch.randint(3, cfg.vocab_size, (150,)).tolist()
    fast = model.reference_logits(toks)
    with reference_ops():
        ref = model.reference_logits(toks)
    if dtype == torch.float32:
        assert rel(fast, ref) < 1e-3
        return
    # a random bf16 model is chaotic (the bf16 reference itself is ~30% off fp32 on k3-small): the kernels must
    # land no further from the fp32 model than the bf16 reference does
    _, model32, _ = _setup(torch.float32)
    with reference_ops():
        exact = model32.reference_logits(toks)
    assert rel(fast, exact) < 1.5 * rel(ref, exact)


@torch.no_grad()
@pytest.mark.parametrize("fuse", [False, True])
def test_graph_decode_matches_eager(fuse):
    from kestrel.engine.cuda_graph import DecodeGraphRunner
    from kestrel.models.forward_batch import ForwardBatch, ForwardMode
    from kestrel.ops import reference_ops

    cfg, model, mem = _setup(torch.float32, fuse)
    B, ctx, ps = 3, 40, 16
    pages, slots = _live_sequences(mem, B)
    pt = torch.tensor(pages, dtype=torch.int32, device="cuda")
    runner = DecodeGraphRunner(model, mem, batch_sizes=(1, 4), max_pages_per_seq=8)
    runner.capture()
    snap = [t.clone() for t in list(mem.state.conv.values()) + list(mem.state.ssm.values())]

    def fb():
        return ForwardBatch(ForwardMode.DECODE, torch.randint(3, 100, (B,), generator=torch.Generator().manual_seed(1)).cuda(),
                            torch.full((B,), ctx, device="cuda"), [1] * B, [ctx] * B, mem=mem, page_table=pt,
                            out_cache_loc=torch.tensor([p[ctx // ps] * ps + ctx % ps for p in pages], device="cuda"),
                            state_slots=torch.tensor(slots, device="cuda"))

    graphed = runner.run(fb()).logits.clone()
    states_g = [t[slots].clone() for t in mem.state.ssm.values()]
    for t, s in zip(list(mem.state.conv.values()) + list(mem.state.ssm.values()), snap):
        t.copy_(s)
    with reference_ops():
        eager = model(fb()).logits
    states_e = [t[slots].clone() for t in mem.state.ssm.values()]
    assert rel(graphed, eager) < 1e-3
    assert max(rel(a, b) for a, b in zip(states_g, states_e)) < 1e-4


@torch.no_grad()
@pytest.mark.parametrize("route_in_experts", [True, False])
def test_pdl_graph_decode_bit_equals_plain_launches(monkeypatch, route_in_experts):
    """Programmatic dependent launch only moves launches earlier: a kernel that read its inputs before waiting for
    the kernel producing them would race. Several batch-1 (GEMV) steps, graphed with PDL on and off from the same
    caches, must give bit-identical logits and states. With the routing as its own launch or inside the expert
    kernels (which read it before their wait either way)."""
    import kestrel.ops as ops
    from kestrel.ops import moe as moe_ops

    monkeypatch.setattr(moe_ops, "ROUTE_IN_EXPERTS", route_in_experts)

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)

    def graphed(on):
        def setup():
            monkeypatch.setattr(ops, "PDL", on)
            return _graphed(model, mem)
        return setup

    results = _replayed_steps(mem, [(on, graphed(on)) for on in (False, True)], 6)
    assert _bit_equal(results[True], results[False])


@torch.no_grad()
def test_combine_in_the_head_gemv(monkeypatch):
    """A decode step's MLA split results merged inside the W_uv head GEMV (mla.COMBINE_IN_HEAD_GEMV_MAX_ROWS),
    batch-1 steps from the same caches: eagerly, every MLA layer's attention output within bf16 rounding of the
    combine kernel + head GEMV pair on the same inputs; graphed with programmatic dependent launch on and off,
    bit-identical logits and states (the head GEMV reads the split results only after its wait: a race would show
    here)."""
    from kestrel.ops import mla as mla_ops
    from kestrel.ops.mla import triton as MK

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)
    monkeypatch.setattr(mla_ops, "COMBINE_IN_HEAD_GEMV_MAX_ROWS", 1)
    seen, project = [], MK.mla_decode_project

    def checked(q_lat, q_rope, buf, pt, lens, rank, scale, w):
        y = project(q_lat, q_rope, buf, pt, lens, rank, scale, w)
        two = MK.head_gemv(MK.mla_decode_paged(q_lat, q_rope, buf, pt, lens, rank, scale)[0], w)
        seen.append(rel(y, two))
        return y

    results = _checked_then_pdl_graphs(monkeypatch, model, mem, MK, "mla_decode_project", checked, 3)
    mla_layers = sum(1 for layer in model.model.layers if hasattr(layer.self_attn, "kv_a_layernorm"))
    assert mla_layers and len(seen) == 3 * mla_layers and max(seen) < 1e-2, seen
    assert _bit_equal(results[True], results[False])


@torch.no_grad()
def test_early_kv_reads(monkeypatch):
    """The MLA decode's split kernel reading its first block of cached latents before its PDL wait
    (mla.triton.EARLY_KV; the newest key after it, since this step's store may still be running): batch-1 graphed
    steps from the same caches give bit-identical logits, caches and states with it off and on, and with PDL off
    and on (a latent read before its store finished would show here)."""
    import kestrel.ops as ops
    from kestrel.ops.mla import triton as MK

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)

    def graphed(early, pdl):
        def setup():
            monkeypatch.setattr(MK, "EARLY_KV", early)
            monkeypatch.setattr(ops, "PDL", pdl)
            return _graphed(model, mem)
        return setup

    keys = [(False, True), (True, False), (True, True)]
    results = _replayed_steps(mem, [(k, graphed(*k)) for k in keys], 4)
    assert _bit_equal(results[True, True], results[False, True])
    assert _bit_equal(results[True, True], results[True, False])


@torch.no_grad()
def test_paired_moe_tail_bit_equals_two_gemvs(monkeypatch):
    """At batch 1 the latent MoE's up projection and the shared experts' down projection run as one paired GEMV:
    decode steps from the same caches give bit-identical logits and states with the pair and with the two GEMVs,
    and the pair really ran (once per MoE layer and step)."""
    from kestrel.ops import linear as linear_ops
    from kestrel.ops.linear import triton as LK

    from kestrel.ops import moe as moe_ops

    monkeypatch.setattr(moe_ops, "SHARED_STREAM", False)  # the pair serves the MoE whose shared experts run in line
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)
    calls = []
    pair = LK.linear_pair
    monkeypatch.setattr(LK, "linear_pair", lambda *a, **k: calls.append(1) or pair(*a, **k))

    def fused(on):
        def setup():
            monkeypatch.setattr(linear_ops, "FUSE_PAIRS", on)
            return model
        return setup

    results = _replayed_steps(mem, [(on, fused(on)) for on in (False, True)], 4)
    moe_layers = sum(1 for layer in model.model.layers if hasattr(layer, "block_sparse_moe"))
    assert moe_layers and len(calls) == 4 * moe_layers
    assert _bit_equal(results[True], results[False])


def _knob_bit_equal(monkeypatch, mem, model, module, knob: str, steps: int = 4) -> None:
    """Decode steps from the same caches with module.knob off (eager), on (eager) and on (graphed, with
    programmatic dependent launch): bit-identical logits and states."""
    import kestrel.ops as ops

    def variant(on, graphed):
        def setup():
            monkeypatch.setattr(module, knob, on)
            monkeypatch.setattr(ops, "PDL", graphed)
            return _graphed(model, mem) if graphed else model
        return setup

    keys = ((False, False), (True, False), (True, True))
    results = _replayed_steps(mem, [(key, variant(*key)) for key in keys], steps)
    assert _bit_equal(results[(True, False)], results[(False, False)])
    assert _bit_equal(results[(True, True)], results[(False, False)])


def _returns_counted(monkeypatch, module, name: str, extra: str, seen: list) -> None:
    """Replace module.name by a wrapper that records, for each call given keyword `extra`, whether the second of
    the pair it returns is not None (what the fast path computed beside its own work)."""
    fn = getattr(module, name)

    def counted(*a, **k):
        out = fn(*a, **k)
        if k.get(extra) is not None:
            seen.append(out[1] is not None)
        return out

    monkeypatch.setattr(module, name, counted)


@torch.no_grad()
def test_shared_experts_activation_in_the_routed_up_gemv(monkeypatch):
    """SHARED_ACT_IN_EXPERTS: the routed experts' up GEMV computes the shared experts' activation for the paired
    tail: decode steps bit-identical with it off and on (eager, and graphed with PDL), and the up GEMV really
    computed it (every MoE layer, every eager step)."""
    from kestrel.ops import moe as moe_ops
    from kestrel.ops.moe import triton as MK

    monkeypatch.setattr(moe_ops, "SHARED_STREAM", False)  # the pair serves the MoE whose shared experts run in line
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)
    carried = []
    _returns_counted(monkeypatch, MK, "moe_experts", "shared", carried)
    _knob_bit_equal(monkeypatch, mem, model, moe_ops, "SHARED_ACT_IN_EXPERTS")
    moe_layers = sum(1 for layer in model.model.layers if hasattr(layer, "block_sparse_moe"))
    assert moe_layers and carried[: 4 * moe_layers] == [True] * (4 * moe_layers)


@torch.no_grad()
def test_output_gate_in_the_kda_recurrence_launch(monkeypatch):
    """OUT_GATE_IN_RECUR: each KDA layer's decode recurrence launch computes sigmoid of the output norm's gate for
    the o_proj prologue: decode steps bit-identical with it off and on (eager, and graphed with PDL), and the
    launch really computed it (every KDA layer, every eager step)."""
    from kestrel.ops import kda as kda_ops
    from kestrel.ops.kda import triton as KK

    cfg, model, mem = _setup(torch.bfloat16, fuse=True)
    carried = []
    _returns_counted(monkeypatch, KK, "kda_decode", "out_gate", carried)
    _knob_bit_equal(monkeypatch, mem, model, kda_ops, "OUT_GATE_IN_RECUR")
    kda_layers = sum(1 for layer in model.model.layers if layer.is_kda)
    assert kda_layers and carried[: 4 * kda_layers] == [True] * (4 * kda_layers)


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_verify_matches_eager_and_folds_like_decode(dtype):
    """The CUDA-graph verify (padded blocks of mixed real lengths) gives the eager verify's logits, features and
    folded states (to GEMM rounding) and writes no state; in fp32, decoding the committed tokens one by one lands on the
    same logits and states within rounding (the projections see other batch shapes there, so bit-exactness is the
    kernel test's: test_kda_verify_and_fold), and the reference ops agree too."""
    from kestrel.engine.cuda_graph import VerifyGraphRunner
    from kestrel.models.forward_batch import ForwardBatch, ForwardMode
    from kestrel.ops import kda as kda_ops, reference_ops

    cfg, model, mem = _setup(dtype, fuse=True)
    B, ctx, ps, L = 3, 40, 16, 6
    pages, slots = _live_sequences(mem, B)
    states = list(mem.state.conv.values()) + list(mem.state.ssm.values())
    snap = [t.clone() for t in states]
    kv_snap = [t.clone() for t in mem.kv.buffers.values()]

    def restore():
        for t, s in zip(states, snap):
            t.copy_(s)
        for t, s in zip(mem.kv.buffers.values(), kv_snap):
            t.copy_(s)

    lens, commit = [6, 2, 4], [3, 2, 4]
    ids = torch.randint(3, 100, (B, L), generator=torch.Generator().manual_seed(1)).cuda()
    scratch = mem.scratch_page * ps

    def fb():
        locs = [p[(ctx + i) // ps] * ps + (ctx + i) % ps if i < n else scratch for p, n in zip(pages, lens)
                for i in range(L)]
        keys = [ctx + min(i, n - 1) + 1 for n in lens for i in range(L)]
        return ForwardBatch(ForwardMode.VERIFY, ids.reshape(-1), torch.arange(ctx, ctx + L, device="cuda").repeat(B),
                            [L] * B, [ctx] * B, mem=mem,
                            page_table=torch.tensor(pages, dtype=torch.int32, device="cuda"),
                            out_cache_loc=torch.tensor(locs, device="cuda"),
                            state_slots=torch.tensor(slots, device="cuda"),
                            capture_layers=(1, 3), verify_lens_t=torch.tensor(lens, dtype=torch.int32, device="cuda"),
                            key_lens_t=torch.tensor(keys, dtype=torch.int32, device="cuda"))

    def fold(f):
        for layer, rec in f.replay.items():
            kda_ops.fold(rec, mem.conv_state(layer), mem.ssm_state(layer), f.state_slots,
                         torch.tensor(commit, dtype=torch.int32, device="cuda"))
        return [t[slots].clone() for t in states]

    runner = VerifyGraphRunner(model, mem, (1, 4), L, 8, (1, 3))
    f_g = fb()
    graphed = runner.run(f_g)
    assert all(torch.equal(t[slots], s[slots]) for t, s in zip(states, snap)), "verify wrote state"
    logits_g, cap_g = graphed.logits.clone(), graphed.captured[3].clone()
    runner.fold(torch.tensor(commit, dtype=torch.int32, device="cuda"))  # the fold graph
    folded_g = [t[slots].clone() for t in states]
    restore()
    f_e = fb()
    eager = model(f_e)
    valid = torch.tensor([i < n for n in lens for i in range(L)], device="cuda")
    # cuBLAS may pick other fp32 GEMM algorithms inside a graph: equal up to their rounding
    assert rel(logits_g[valid], eager.logits[valid]) < 1e-5 and rel(cap_g[valid], eager.captured[3][valid]) < 1e-5
    folded_e = fold(f_e)
    assert max(rel(a, b) for a, b in zip(folded_g, folded_e)) < 1e-5
    if dtype != torch.float32:  # a random bf16 model is chaotic: the rest compares across batch shapes
        return
    restore()
    for t in range(max(commit)):
        rows = [i for i in range(B) if t < commit[i]]
        pos = ctx + t
        d = ForwardBatch(ForwardMode.DECODE, ids[rows, t], torch.full((len(rows),), pos, device="cuda"),
                         [1] * len(rows), [pos] * len(rows), mem=mem,
                         page_table=torch.tensor([pages[i] for i in rows], dtype=torch.int32, device="cuda"),
                         out_cache_loc=torch.tensor([pages[i][pos // ps] * ps + pos % ps for i in rows], device="cuda"),
                         state_slots=torch.tensor([slots[i] for i in rows], device="cuda"))
        out = model(d)
        row_logits = logits_g.view(B, L, -1)[rows, t]
        assert rel(out.logits, row_logits) < 1e-4
    decoded = [t[slots].clone() for t in states]
    assert max(rel(a, b) for a, b in zip(folded_g, decoded)) < 1e-4
    restore()
    with reference_ops():
        ref = model(fb())
    assert rel(logits_g[valid], ref.logits[valid]) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drafter_norm_kernel_matches_the_formula(dtype):
    """Drafting on the GPU (no autograd) takes the RMSNorm kernel, training the differentiable formula: the same
    norm within rounding, on row-strided inputs, with and without a weight."""
    from kestrel.spec.drafter import rms

    x = torch.randn(5, 7, 256, device="cuda").to(dtype)[:, 2]  # rows 7 * 256 apart
    w = (1 + 0.1 * torch.randn(256, device="cuda")).to(dtype)
    for weight in (w, None):
        with torch.no_grad():
            fast = rms(x, 1e-6, weight)
        with torch.enable_grad():
            ref = rms(x, 1e-6, weight)
        assert fast.dtype == ref.dtype == dtype
        assert rel(fast, ref) < (1e-6 if dtype == torch.float32 else 1e-2)


@torch.no_grad()
@pytest.mark.parametrize("graph", [False, True])
def test_shared_experts_beside_routed_bit_equal_in_line(monkeypatch, graph):
    """The MoE's shared experts on a second stream (moe_ops.side_stream), their output summed by the routed up
    projection's epilogue, against the shared experts in line after the routed ones (the paired tail): bit-identical
    logits and states over several batch-1 decode steps, eager and in a PDL CUDA graph (where the fork and join
    are graph edges). The second stream really ran the shared experts (its own kernels, once per MoE layer)."""
    import kestrel.ops as ops
    from kestrel.engine.cuda_graph import DecodeGraphRunner
    from kestrel.ops import moe as moe_ops

    if graph and torch.cuda.get_device_capability()[0] >= 9:
        monkeypatch.setattr(ops, "PDL", True)
    monkeypatch.setattr(moe_ops, "SHARED_STREAM_MIN_TOKENS", 1)  # the engine keeps one token in line (slower)
    cfg, model, mem = _setup(torch.bfloat16, fuse=True)
    forks = []
    side = moe_ops.side_stream
    monkeypatch.setattr(moe_ops, "side_stream", lambda x: (s := side(x)) is not None and forks.append(s) or s)

    def variant(on):
        def setup():
            monkeypatch.setattr(moe_ops, "SHARED_STREAM", on)
            if not graph:
                return model
            runner = DecodeGraphRunner(model, mem, batch_sizes=(1,), max_pages_per_seq=8)
            runner.capture()
            return runner.run
        return setup

    results = _replayed_steps(mem, [(on, variant(on)) for on in (False, True)], 4)
    moe_layers = sum(1 for layer in model.model.layers if hasattr(layer, "block_sparse_moe"))
    assert moe_layers and forks and all(s is forks[0] for s in forks)
    assert forks[0] != torch.cuda.current_stream()
    assert len(forks) >= (1 if graph else 4) * moe_layers
    assert _bit_equal(results[True], results[False])
