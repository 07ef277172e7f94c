"""The DSpark drafter's and the greedy speculative step's Triton kernels against their plain-torch references on
fresh random inputs (CUDA; or the Triton interpreter on CPU tensors with TRITON_INTERPRET=1): see test_kernels.py."""

import pytest
import torch

from tests.gpu.kernel_common import KERNEL_MARKS, DEV, SMALL, TOL, rel, rnd

pytestmark = KERNEL_MARKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [16384, 1024])
def test_dspark_accept_greedy(dtype, tile, monkeypatch):
    """Greedy acceptance on the device (argmax of every verified position, the longest matching prefix capped by
    the drafts each block may keep, commit, due snapshots, the next features' rows) in one kernel, against the
    reference: equal, with ties in the logits (across the kernel's vocabulary chunks too) and drafts spoiled at
    chosen positions."""
    from kestrel.ops.dspark import reference as R, step_triton as K
    monkeypatch.setattr(K, "ACCEPT_TILE", tile)  # 1024: pieces of 128 / 256 columns at L = 8 / 4
    B, G, V = 6, 7, (300 if SMALL else 4096)
    for L in (G + 1, 4):
        logits = rnd(B * L, V, dtype=dtype)
        # ties: the lower id is the argmax; block 1 fails at position 2, so that position's argmax is the token the
        # block ends with (row 3, block 0's, is past its first failure: the tie there is not read)
        for r in (3, L + 2):
            logits[r, 10] = logits[r, 200] = logits[r].max() + 1
        top = logits.float().argmax(-1).view(B, L)
        drafts = torch.randint(0, V, (B, G), device=DEV)
        drafts[:, : L - 1] = top[:, : L - 1]
        spoil = torch.tensor([0, 2, L - 2, 1, L, 5], device=DEV)  # >= L - 1: every draft matches
        for b, j in enumerate(spoil.tolist()):
            if j < L - 1:
                drafts[b, j] = (drafts[b, j] + 1) % V
        keep = torch.tensor([G, G, G, 0, 3, G], device=DEV)
        n = torch.tensor([G + 1, G + 1, 4, 1, 0, G + 1], device=DEV)
        snap_n = torch.tensor([1, 0, 3, 1, 2, L], device=DEV)
        got, ref = K.accept_greedy(logits, drafts, keep, n, snap_n), R.accept_greedy(logits, drafts, keep, n, snap_n)
        for a, b in zip(got, ref):
            assert a.dtype == b.dtype and torch.equal(a, b), (L, a, b)
        # publishing the next token and the prefix length after the commit for a chained step (distinct slots; the
        # rest untouched)
        at = torch.randperm(20, device=DEV)[:B]
        prefix = torch.randint(0, 500, (B,), device=DEV)
        pub = [(torch.full((21,), -5, dtype=torch.long, device=DEV), torch.full((21,), -5, dtype=torch.long,
                device=DEV), at, prefix) for _ in range(2)]
        got = K.accept_greedy(logits, drafts, keep, n, snap_n, pub[0])
        ref = R.accept_greedy(logits, drafts, keep, n, snap_n, pub[1])
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
        assert torch.equal(pub[0][0], pub[1][0]) and torch.equal(pub[0][1], pub[1][1])
        assert torch.equal(pub[0][0][at], ref[0][:, G]) and torch.equal(pub[0][1][at], prefix + ref[1].long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dspark_correction(dtype):
    """The drafter's correction up projection (three weightless RMSNorms, the previous token's embedding, silu)
    and the vocabulary argmax as partial keys, against the reference; the previous tokens given as ids or as the
    keys, ties to the lower id."""
    from kestrel.ops.dspark import reference as R, triton as K
    B, D, T, C, V = (3, 24, 32, 48, 100) if SMALL else (5, 192, 256, 384, 4096)
    slot, state = rnd(B, D, dtype=dtype), rnd(B, D, dtype=dtype)
    emb, w = rnd(V, T, dtype=dtype), rnd(C, 2 * D + T, dtype=dtype, scale=(2 * D + T) ** -0.5)
    ids = torch.randint(0, V, (B,), device=DEV)
    assert rel(K.correct_up(slot, state, ids, emb, w, 1e-5), R.correct_up(slot, state, ids, emb, w, 1e-5)) < TOL[dtype]
    # ties: rows 7 and 40 of the vocabulary equal and the best for every h; the lower id wins, as torch.argmax picks
    emb[40] = emb[7] = 0
    h = rnd(B, T, dtype=dtype)
    emb[7] = emb[40] = (h[0] * 50).to(dtype)
    keys = K.head_keys(h, emb)
    assert keys.shape[0] == B and keys.dtype == torch.int64
    assert torch.equal(R.decode(keys)[:1], torch.tensor([7], device=DEV))
    logits = torch.nn.functional.linear(h.float(), emb.float())
    got = R.decode(keys)
    # each pick is the best logit up to the output's rounding
    best = logits.max(-1).values
    assert bool((logits.gather(-1, got[:, None])[:, 0] >= best - best.abs() * 2 * TOL[dtype]).all())
    assert torch.equal(R.decode(keys), R.decode(R.head_keys(h, emb))) or dtype == torch.bfloat16
    # the next position's kernel reads the keys: the same as reading their ids
    assert torch.equal(K.correct_up(slot, state, keys, emb, w, 1e-5), K.correct_up(slot, state, got, emb, w, 1e-5))
    # the slot's and state's part summed before the token's (early, as after a late-triggered vocabulary kernel)
    want = R.correct_up(slot, state, got, emb, w, 1e-5)
    assert rel(K.correct_up(slot, state, keys, emb, w, 1e-5, early=True), want) < TOL[dtype]
    assert torch.equal(K.head_keys(h, emb, late_trigger=True), keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dspark_head_stats_and_first_confidence(dtype):
    """The context lookup's gate on the fast drafting path: the vocabulary kernel's per-tile summaries (largest two
    logits, exp-sum) give the drafter's peak, ties across and within tiles included, without changing its keys;
    the confidence kernel (peak, the state's RMSNorm, the two-layer head, sigmoid) against the reference on the
    same summaries."""
    import torch.nn.functional as F

    from kestrel.ops.dspark import reference as R, triton as K
    torch.manual_seed(3)
    B, D, T, C, V = (3, 24, 32, 16, 200) if SMALL else (5, 192, 256, 64, 4096)
    h, w = rnd(B, T, dtype=dtype), rnd(V, T, dtype=dtype, scale=T**-0.5)
    w[V - 1] = w[3] = (h[1] * 4 / h[1].float().norm().item()).to(dtype)  # row 1: a tie for the largest, far apart
    keys, stats = K.head_keys(h, w, stats=True)
    assert torch.equal(keys, K.head_keys(h, w)) and stats.shape == (B, keys.shape[1], 3) and keys.shape[1] > 1
    lg = F.linear(h.float(), w.float()).to(dtype)  # the logits as the kernel rounds them (to its summation order)
    peak = R.peak(stats)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(peak, R.peak(R.head_stats(lg).unsqueeze(1)), rtol=0, atol=tol)
    assert peak[1, 0] == peak[1, 1]  # the tie: the second largest is the largest
    # a folded head (eps): the kernel RMS-normalises each row itself, as normalising first does (3x rows: not ~1)
    hs = (h * 3).to(dtype)
    kn, sn = K.head_keys(hs, w, stats=True, eps=1e-5)
    lgn = F.linear(R.rms(hs, 1e-5).float(), w.float()).to(dtype).float()
    torch.testing.assert_close(R.peak(sn), R.peak(R.head_stats(lgn).unsqueeze(1)), rtol=0, atol=tol)
    best = lgn.max(-1).values
    assert bool((lgn.gather(-1, R.decode(kn)[:, None])[:, 0] >= best - best.abs() * 2 * TOL[dtype]).all())
    assert torch.equal(R.decode(kn), R.decode(R.head_keys(hs, w, eps=1e-5))) or dtype == torch.bfloat16
    # the tiles' reduction alone (reference.peak over a split row against the whole row): ties inside one tile too
    x = torch.randn(4, 96) * 4
    x[1, 5] = x[1, 9] = x[1].max() + 1
    tiles = R.head_stats(x.view(4, 6, 16))  # [4, 6, 3]
    torch.testing.assert_close(R.peak(tiles), R.peak(R.head_stats(x).unsqueeze(1)), rtol=0, atol=1e-5)
    torch.testing.assert_close(R.peak(R.head_stats(x).unsqueeze(1)),
                               x.topk(2, -1).values - torch.logsumexp(x, -1, keepdim=True), rtol=0, atol=1e-5)
    assert R.peak(tiles)[1, 0] == R.peak(tiles)[1, 1]
    up, down = torch.nn.Linear(D + 2, C, dtype=dtype, device=DEV), torch.nn.Linear(C, 1, dtype=dtype, device=DEV)
    with torch.no_grad():
        # fan-in scaled, so the head's logit is O(1) and the sigmoid far from saturating: the rows' confidences differ
        for p, scale in ((up.weight, (D + 2) ** -0.5), (up.bias, 0.5), (down.weight, 2 * C**-0.5), (down.bias, 0.5)):
            p.copy_(rnd(*p.shape, dtype=dtype, scale=scale))
        state = rnd(B, D, dtype=dtype)
        got, want = K.first_confidence(stats, state, up, down, 1e-5), R.first_confidence(stats, state, up, down, 1e-5)
    assert got.shape == want.shape == (B, 1) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 if dtype == torch.float32 else 3e-2)
    assert float(want.std()) > 0.01  # the rows differ: a kernel reading one row for all would fail
    # the same confidence computed by the tokens' decode launch, bit for bit, the tokens unchanged
    more = [keys, K.head_keys(hs, w)]
    with torch.no_grad():
        toks, conf = K.decode_keys(more, (stats, state, up, down, 1e-5))
    assert torch.equal(toks, K.decode_keys(more)) and torch.equal(conf, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dspark_block_front_and_decode_keys(dtype):
    """The drafter block's input in one kernel (each feature layer's and the token embedding's RMSNorm with its
    weight, the context projection, the slots added) against the module formulas (reference.block_front), for
    rows of features with a stride and each row's own token; the drafted positions' keys decoded in one launch,
    exact."""
    from kestrel.ops.dspark import reference as R, triton as K
    torch.manual_seed(4)
    N, L, T, D, V, G = (2, 2, 16, 24, 50, 3) if SMALL else (5, 4, 256, 192, 4096, 7)
    wide = rnd(N, L * T + 40, dtype=dtype, scale=3.0)
    feats = wide[:, : L * T]  # rows 40 columns apart, as a larger buffer's view
    # each layer's part at its own scale (the norms are per layer: one norm over the row would fail)
    feats.view(N, L, T).mul_(torch.arange(1, L + 1, device=DEV, dtype=dtype).view(1, L, 1))
    emb = rnd(V, T, dtype=dtype)
    fnorm, tnorm = (1 + rnd(L, T, dtype=dtype, scale=0.3)), (1 + rnd(T, dtype=dtype, scale=0.3))
    fc = rnd(D, (L + 1) * T, dtype=dtype, scale=((L + 1) * T) ** -0.5)
    slots = rnd(G, D, dtype=dtype)
    tok = torch.randint(0, V, (N,), device=DEV)
    got = K.block_front(feats, tok, emb, fnorm, tnorm, fc, slots, 1e-5)
    want = R.block_front(feats, tok, emb, fnorm, tnorm, fc, slots, 1e-5)
    assert got.shape == want.shape == (N, G + 1, D) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]
    assert rel(got[:, 1:] - got[:, :1], slots.expand(N, G, D)) < 4 * TOL[dtype]  # each slot added to its row's ctx
    # a row's token matters: another token changes only that row
    tok2 = tok.clone()
    tok2[0] = (tok[0] + 1) % V
    got2 = K.block_front(feats, tok2, emb, fnorm, tnorm, fc, slots, 1e-5)
    assert not torch.equal(got2[0], got[0]) and torch.equal(got2[1:], got[1:])
    # the keys of G positions, each [N, P] (ties to the lower id inside a position's tiles)
    P = 3
    vals = rnd(G, N, P * 8)
    vals[0, 0, 5] = vals[0, 0, 17] = vals[0, 0].max() + 1  # position 0, row 0: a tie across two tiles
    ids = torch.arange(P * 8, device=DEV)
    keys = [R.pack(v, ids).view(N, P, 8).amax(-1) for v in vals]
    out = K.decode_keys(keys)
    assert torch.equal(out, R.decode_keys(keys)) and out.shape == (N, G)
    assert torch.equal(out, vals.argmax(-1).t()) and int(out[0, 0]) == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S", [1, 5, 8])
def test_dspark_block_attention(dtype, S):
    """The drafter block's causal attention in one kernel against scaled_dot_product_attention on the same q, k, v:
    per request, per head, causal (a later position's inputs change no earlier output, and another request's
    nothing), read from a wider buffer's rows."""
    from kestrel.ops.dspark import reference as R, triton as K
    torch.manual_seed(5)
    N, H, hd = 3, 4, 48
    D = H * hd
    wide = rnd(N * S, 3 * D + 24, dtype=dtype, scale=2.0)
    qkv = wide[:, : 3 * D]  # rows 24 columns apart
    got = K.block_attention(qkv, H, S)
    want = R.block_attention(qkv.float(), H, S)
    assert got.shape == (N * S, D) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]
    moved = qkv.clone()
    moved.view(N, S, 3, D)[0, S - 1] += 1.0  # request 0's last position: its q, k and v
    again = K.block_attention(moved, H, S).view(N, S, D)
    got = got.view(N, S, D)
    assert torch.equal(again[0, : S - 1], got[0, : S - 1]) and torch.equal(again[1:], got[1:])
    assert not torch.equal(again[0, S - 1], got[0, S - 1])
    # fp64, and blocks past the kernel's tile, go to the reference
    assert torch.equal(K.block_attention(qkv.double(), H, S), R.block_attention(qkv.double(), H, S))
    long = rnd(2 * 32, 3 * D, dtype=dtype)
    assert rel(K.block_attention(long, H, 32), R.block_attention(long.float(), H, 32)) < TOL[dtype]


@pytest.mark.parametrize("page_size", [1, 16])
def test_dspark_step_inputs(page_size):
    """The speculative step's first ops as kernels against the torch formulation, exactly: each request's last token
    and prefix (future references to the batch in flight, chained rows taking the prefix it leaves), and the VERIFY
    batch's
    positions, cache locations, keys per token and real-token counts (padding blocks with n = 0, blocks past the
    page table's width clamped, the scratch page for padding steps)."""
    from kestrel.ops.dspark import reference as R, step_triton as K
    g = torch.Generator().manual_seed(11)
    B, L, width, F = 13, 8, 16, 40
    future = torch.randint(0, 1000, (F,), generator=g).to(DEV)
    after = torch.randint(0, page_size * width - L, (F,), generator=g).to(DEV)  # prefix lengths chained rows take
    x0 = torch.randint(0, 1000, (B,), generator=g)
    x0[::3] = -1 - torch.randint(0, F, (len(x0[::3]),), generator=g)  # future references
    ref = torch.randint(-1, F, (B,), generator=g)
    prefix = torch.randint(0, page_size * width - L, (B,), generator=g)
    x0, ref, prefix = x0.to(DEV), ref.to(DEV), prefix.to(DEV)
    keep = torch.randint(-1, L, (B,), generator=g).to(DEV)
    keep[0] = -1  # a padding row
    got, want = K.resolve(x0, prefix, ref, future, after, keep), R.resolve(x0, prefix, ref, future, after, keep)
    assert len(got) == 4 and all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))
    assert torch.equal(got[2], keep + 1) and torch.equal(got[3], keep >= 0)
    want_x0 = want[0]
    assert bool((want[0] != x0).any()) and bool((want[1] != prefix).any())
    assert torch.equal(want[1], torch.where(ref >= 0, after[ref.clamp_min(0)], prefix))
    n = torch.randint(0, L + 1, (B,), generator=g).to(DEV)
    n[0], n[1] = 0, L
    table = torch.randint(1, 50, (B, width), generator=g).to(torch.int32).to(DEV)
    prefix = want[1].clone()
    prefix[2] = page_size * width + 3  # past the table: its real steps read the last page (clamped)
    got = K.block_positions(prefix, n, table, page_size, 0, L)
    want = R.block_positions(prefix, n, table, page_size, 0, L)
    assert got[4] is None and want[4] is None
    for a, b in zip(got[:4], want[:4]):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
    # the blocks' token ids in the same launch: [x0, drafts[:, :L - 1]] (drafts wider than the block)
    drafts = torch.randint(0, 1000, (B, L + 2), generator=g).to(DEV)
    got = K.block_positions(prefix, n, table, page_size, 0, L, want_x0, drafts)
    want = R.block_positions(prefix, n, table, page_size, 0, L, want_x0, drafts)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
    assert torch.equal(got[4].view(B, L)[:, 0], want_x0)
    # the next features: rows of four captured layers side by side (one of them a strided view)
    parts = [rnd(40, 24), rnd(40, 24), rnd(40, 48)[:, 8:32], rnd(40, 24)]
    rows = torch.randint(0, 40, (B,), generator=g).to(DEV)
    assert torch.equal(K.gather_rows(parts, rows), R.gather_rows(parts, rows))
    assert torch.equal(K.gather_rows(parts[:3], rows), R.gather_rows(parts[:3], rows))
