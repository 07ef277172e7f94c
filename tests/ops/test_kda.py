import pytest
import torch

from kestrel.ops.kda import reference as ref
from tests.conftest import rel_err


def make(T, H=2, K=8, V=6, dtype=torch.float64, lb=-5.0, gate_scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = ref.l2norm(torch.randn(T, H, K, generator=g, dtype=dtype))
    k = ref.l2norm(torch.randn(T, H, K, generator=g, dtype=dtype))
    v = torch.randn(T, H, V, generator=g, dtype=dtype)
    raw = torch.randn(T, H, K, generator=g, dtype=dtype) * gate_scale
    gate = ref.kda_gate(raw, torch.randn(H, generator=g, dtype=dtype) * 0.5, torch.randn(H * K, generator=g, dtype=dtype), lb)
    beta = torch.rand(T, H, generator=g, dtype=dtype)
    return q, k, v, gate, beta


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130, 200])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("lb", [-5.0, None])
def test_chunked_equals_recurrent(T, with_state, lb):
    # safe gates take the factored sub-chunk path; large softplus gates (lb None, scale 30) the pairwise one
    q, k, v, g, b = make(T, seed=T, lb=lb, gate_scale=3.0 if lb else 30.0)
    assert (g.min() < -10) == (lb is None)
    S0 = torch.randn(1, 2, 8, 6, dtype=torch.float64) if with_state else None
    o_rec, s_rec = ref.kda_recurrent(q[None], k[None], v[None], g[None], b[None], initial_state=S0)
    o_chk, s_chk = ref.kda_chunked(q, k, v, g, b, initial_state=S0)
    assert rel_err(o_chk, o_rec[0]) < 1e-12
    assert rel_err(s_chk, s_rec) < 1e-12


@pytest.mark.parametrize("lb", [None, -5.0])
@pytest.mark.parametrize("layout", ["mixed", "whole chunks"])
def test_packed_varlen_equals_one_by_one(lb, layout):
    # "whole chunks": equal lengths starting on chunk boundaries, served as one view of the packed batch
    lens, starts = ([1, 63, 64, 65, 130, 7], [0, 5, 64, 0, 100, 63]) if layout == "mixed" else ([64] * 3, [0, 64, 128])
    q, k, v, g, b = make(sum(lens), lb=lb, seed=1)
    S0 = torch.randn(len(lens), 2, 8, 6, dtype=torch.float64)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    o, s = ref.kda_chunked(q, k, v, g, b, cu_seqlens=cu, initial_state=S0, start_positions=starts)
    for i in range(len(lens)):
        a, e = cu[i], cu[i + 1]
        o_i, s_i = ref.kda_recurrent(q[None, a:e], k[None, a:e], v[None, a:e], g[None, a:e], b[None, a:e],
                                     initial_state=S0[i : i + 1])
        assert rel_err(o[a:e], o_i[0]) < 1e-12
        assert rel_err(s[i], s_i[0]) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lb", [None, -5.0])
def test_sequences_in_cache_sized_groups_equal_one_pass(dtype, lb, monkeypatch):
    # the CPU form runs packed sequences in groups of CPU_GROUP_BYTES: a group of one sequence each (1 byte) must give
    # the bits of one pass over all of them, chunk states included, for aligned and mixed layouts
    for lens, starts in (([1, 63, 64, 65, 130, 7], [0, 5, 64, 0, 100, 63]), ([32] * 5, [0] * 5)):
        q, k, v, g, b = make(sum(lens), lb=lb, dtype=dtype, seed=5, gate_scale=3.0 if lb else 30.0)
        S0 = torch.randn(len(lens), 2, 8, 6, dtype=dtype)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        res = {}
        for budget in (1 << 40, 1):
            monkeypatch.setattr(ref, "CPU_GROUP_BYTES", budget)
            res[budget] = ref.kda_chunked(q, k, v, g, b, cu_seqlens=cu, initial_state=S0, start_positions=starts,
                                          output_chunk_states=True)
        (o1, s1, c1), (o2, s2, c2) = res[1 << 40], res[1]
        assert torch.equal(o1, o2) and torch.equal(s1, s2)
        for (p1, t1), (p2, t2) in zip(c1, c2):
            assert p1 == p2 and torch.equal(t1, t2)


def test_chunk_states_sit_on_absolute_boundaries():
    q, k, v, g, b = make(150, seed=2)
    start = 40
    o, s, per_seq = ref.kda_chunked(q, k, v, g, b, start_positions=[start], output_chunk_states=True)
    positions, states = per_seq[0]
    assert positions == [64, 128, 190]
    for pos, st in zip(positions, states):
        n = pos - start
        _, s_ref = ref.kda_recurrent(q[None, :n], k[None, :n], v[None, :n], g[None, :n], b[None, :n])
        assert rel_err(st, s_ref[0]) < 1e-12


def test_safe_gates_at_the_bound_do_not_overflow_fp32():
    # every gate at the lower bound: a 64-token chunk sums to -320, far past exp's fp32 range
    q, k, v, g, b = make(128, dtype=torch.float32, seed=3)
    g = torch.full_like(g, -5.0 + 1e-4)
    o_c, s_c = ref.kda_chunked(q, k, v, g, b)
    o_r, s_r = ref.kda_recurrent(q[None], k[None], v[None], g[None], b[None])
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    assert rel_err(o_c, o_r[0]) < 1e-5


def test_factored_training_form_matches_recurrent():
    q, k, v, g, b = make(100, seed=4, gate_scale=10.0)
    q, k, v, g, b = (t.view(2, 50, *t.shape[1:]) for t in (q, k, v, g, b))
    o_r, _ = ref.kda_recurrent(q, k, v, g, b)
    o_f = ref.kda_chunked_factored(q, k, v, g, b, min_gate=-5.0)
    assert rel_err(o_f, o_r) < 1e-12


def test_step_is_the_recurrence():
    """S <- diag(exp g) S; u = v - S^T k; S <- S + beta k u^T; o = S^T (scale q), written out by hand."""
    q, k, v, g, b = make(1, H=1, K=3, V=2, seed=5)
    S = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    expect = torch.diag(torch.exp(g[0, 0])) @ S[0, 0]
    u = v[0, 0] - expect.T @ k[0, 0]
    expect = expect + b[0, 0] * torch.outer(k[0, 0], u)
    o = ref.kda_step(S, q[0:1], k[0:1], v[0:1], g[0:1], b[0:1], scale=0.5)
    assert torch.allclose(S[0, 0], expect, atol=1e-14)
    assert torch.allclose(o[0, 0], expect.T @ (0.5 * q[0, 0]), atol=1e-14)


def test_gate_forms():
    raw = torch.randn(5, 2, 4, dtype=torch.float64)
    A_log, dt = torch.randn(2, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    x = raw + dt.view(2, 4)
    soft = ref.kda_gate(raw, A_log, dt, None)
    assert torch.allclose(soft, -torch.exp(A_log).view(2, 1) * torch.nn.functional.softplus(x))
    safe = ref.kda_gate(raw, A_log, dt, -5.0)
    assert torch.allclose(safe, -5.0 * torch.sigmoid(torch.exp(A_log).view(2, 1) * x))
    assert (safe > -5.0).all() and (safe < 0).all()


def test_conv_matches_torch_conv1d_and_is_length_invariant():
    C, W, L = 6, 4, 9
    x = torch.randn(1, L, C, dtype=torch.float64)
    w = torch.randn(C, W, dtype=torch.float64)
    y, window = ref.causal_conv1d(x, w, None)
    conv = torch.nn.functional.conv1d(x.transpose(1, 2), w.unsqueeze(1), padding=W - 1, groups=C)[..., :L]
    assert torch.allclose(y, torch.nn.functional.silu(conv.transpose(1, 2)), atol=1e-14)
    # token by token from the running tail gives the same outputs and the same tail
    tail = torch.zeros(1, W - 1, C, dtype=torch.float64)
    for t in range(L):
        yt, win = ref.causal_conv1d(x[:, t : t + 1], w, tail)
        assert torch.allclose(yt[0, 0], y[0, t], rtol=0, atol=1e-15)
        tail = win[:, 1:]
    assert torch.equal(tail, window[:, -(W - 1):])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_in_place_on_consecutive_slots_equals_gather_scatter(dtype):
    """Consecutive slots let the CPU decode update the pool through a view; scattered ones take the gather /
    scatter path. The same sequences in either layout: bit-identical outputs, conv tails and states."""
    B, H, K = 4, 2, 8
    C = 3 * H * K
    sdt = ref.state_dtype_for(dtype)
    g = torch.Generator().manual_seed(0)
    mixed, raw = torch.randn(B, C, generator=g).to(dtype), torch.randn(B, H, K, generator=g).to(dtype)
    beta = torch.rand(B, H, generator=g).to(dtype)
    w, A_log, dt_bias = torch.randn(C, 4, generator=g).to(dtype), torch.randn(H, dtype=sdt), torch.randn(H * K, dtype=sdt)
    conv0, ssm0 = torch.randn(B, 3, C, generator=g).to(dtype), torch.randn(B, H, K, K, generator=g, dtype=sdt)
    out = {}
    for layout, slots in (("view", torch.tensor([2, 3, 4, 5])), ("gather", torch.tensor([5, 2, 6, 3]))):
        assert isinstance(ref.slot_rows(slots), slice) == (layout == "view")
        conv, ssm = torch.zeros(8, 3, C, dtype=dtype), torch.zeros(8, H, K, K, dtype=sdt)
        conv[slots], ssm[slots] = conv0, ssm0
        o = ref.kda_decode(mixed, w, conv, ssm, slots, raw, A_log, dt_bias, -5.0, beta, K**-0.5)
        out[layout] = (o, conv[slots], ssm[slots])
    assert all(torch.equal(a, b) for a, b in zip(out["view"], out["gather"]))
    assert not torch.equal(out["view"][2], ssm0)  # the states did advance


def test_chunk_table_covers_every_row_once_in_aligned_chunks():
    from kestrel.ops.kda.layout import chunk_table
    rng = torch.Generator().manual_seed(0)
    C = 64
    for _ in range(100):
        N = int(torch.randint(1, 6, (1,), generator=rng))
        lens = torch.randint(0, 300, (N,), generator=rng).tolist()
        starts = torch.randint(0, 500, (N,), generator=rng).tolist()
        cu = [0]
        for L in lens:
            cu.append(cu[-1] + L)
        tab, offsets = chunk_table(cu, starts, C)
        NC = offsets[-1]
        assert tab.dtype.name == "int32" and len(tab) == 4 * NC + 2 * N + 1
        assert tab[4 * NC : 4 * NC + N + 1].tolist() == offsets
        order = tab[4 * NC + N + 1 :].tolist()
        counts = [offsets[i + 1] - offsets[i] for i in order]
        assert sorted(order) == list(range(N)) and counts == sorted(counts, reverse=True)
        seen = torch.zeros(cu[-1], dtype=torch.long)
        for i in range(N):
            assert offsets[i + 1] - offsets[i] == -(-(starts[i] % C + lens[i]) // C)
            for c in range(offsets[i], offsets[i + 1]):
                seq, first, lo, hi = tab[4 * c : 4 * c + 4].tolist()
                assert (seq, lo, hi) == (i, cu[i], cu[i + 1])
                assert (starts[i] + first - cu[i]) % C == 0  # the chunk starts at an absolute multiple of C
                rows = range(max(first, lo), min(first + C, hi))
                assert len(rows) > 0
                seen[list(rows)] += 1
        assert bool((seen == 1).all())


def conv_inputs(lens: list[int], W: int, dtype, seed: int, C: int = 24):
    """(cu, x [T, C], conv weight [C, W], cached tails [N, W - 1, C]) for packed sequences of these lengths."""
    gen = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    x = torch.randn(cu[-1], C, generator=gen, dtype=dtype)
    w = torch.randn(C, W, generator=gen, dtype=dtype)
    return cu, x, w, torch.randn(len(lens), W - 1, C, generator=gen, dtype=dtype)


@pytest.mark.parametrize("many", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_conv_equals_the_per_sequence_conv(dtype, many):
    """PackedConvWindows (one pass over packed sequences) against causal_conv1d per sequence: the same outputs and
    the same conv tails after any prefix, tails reaching back into the cached ones included."""
    W = 4
    cu, x, w, tails = conv_inputs([1, 2, 7, 3, 16] if many else [9], W, dtype, seed=11)
    conv = ref.PackedConvWindows(x, cu, w, tails)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        y, window = ref.causal_conv1d(x[None, a:b], w, tails[i : i + 1])
        assert rel_err(conv.y[a:b], y[0]) < (1e-6 if dtype == torch.float32 else 1e-14)
        for end in range(b - a + 1):
            got = conv.rows([i], [end])[0]
            assert torch.equal(got, window[0, end : end + W - 1]), (i, end)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_conv_in_row_blocks_equals_one_pass(dtype, monkeypatch):
    """On a CPU the conv's taps run over blocks of rows (CPU_BLOCK_BYTES): blocks of 16 rows give the bits of one
    pass over all of them, across sequence boundaries and with the other sequences' first rows fixed up after."""
    cu, x, w, tails = conv_inputs([1, 40, 7, 33, 64], 4, dtype, seed=12)
    ys = []
    for budget in (1 << 40, 1):
        monkeypatch.setattr(ref, "CPU_BLOCK_BYTES", budget)
        ys.append(ref.PackedConvWindows(x, cu, w, tails).y)
    assert torch.equal(ys[0], ys[1])
