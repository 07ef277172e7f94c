"""Triton kernels against their plain-torch references on fresh random inputs (CUDA; or the Triton interpreter on
CPU tensors with TRITON_INTERPRET=1, fp32 only where a kernel uses tl.dot, which the interpreter gets wrong in bf16).

Outputs are poisoned with NaN before each call, so anything a kernel fails to write fails the comparison.
"""

import pytest
import torch

from tests.gpu.kernel_common import KERNEL_MARKS, INTERPRET, DEV, SMALL, TOL, STATE_TOL, DOT_DTYPES, rel, rnd

pytestmark = KERNEL_MARKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms(dtype):
    from kestrel.ops.norm import reference as R, triton as K
    D = 64 if SMALL else 2048
    x, w, g, r = rnd(7, D, dtype=dtype), rnd(D, dtype=dtype), rnd(7, D, dtype=dtype), rnd(7, D, dtype=dtype)
    assert rel(K.rms_norm(x, w, 1e-5), R.rms_norm(x, w, 1e-5)) < TOL[dtype]
    assert rel(K.rms_norm(x, None, 1e-5), R.rms_norm(x, None, 1e-5)) < TOL[dtype]
    assert rel(K.gated_rms_norm(x.view(7, -1, 16), g.view(7, -1, 16), w[:16], 1e-5),
               R.gated_rms_norm(x.view(7, -1, 16), g.view(7, -1, 16), w[:16], 1e-5)) < TOL[dtype]
    s1, n1 = K.add_rms_norm(x, r, w, 1e-5)
    s2, n2 = R.add_rms_norm(x, r, w, 1e-5)
    assert rel(s1, s2) < TOL[dtype] and rel(n1, n2) < TOL[dtype]
    # the embedding lookup and the first norm in one kernel: the rows exact, the norm bit-equal to rms_norm's
    table, ids = rnd(50, D, dtype=dtype), torch.tensor([3, 0, 49, 3, 17], device=DEV)
    e1, z1 = K.embed_rms_norm(ids, table, w, 1e-5)
    e2, z2 = R.embed_rms_norm(ids, table, w, 1e-5)
    assert torch.equal(e1, e2) and torch.equal(z1, K.rms_norm(e2, w, 1e-5)) and rel(z1, z2) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 3, 7])
def test_attn_res(dtype, n):
    from kestrel.ops.attn_res import reference as R, triton as K
    D = 64 if SMALL else 2048
    vals = [rnd(5, D, dtype=dtype) for _ in range(n)]
    w, nw = rnd(D, dtype=dtype, scale=D**-0.5), rnd(D, dtype=dtype)
    assert rel(K.attn_res(vals, w, 1e-5), R.attn_res(vals, w, 1e-5)) < TOL[dtype]
    h1, z1 = K.attn_res_norm(vals, w, 1e-5, nw, 1e-5)
    h2, z2 = R.attn_res_norm(vals, w, 1e-5, nw, 1e-5)
    assert rel(h1, h2) < TOL[dtype] and rel(z1, z2) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 6])
@pytest.mark.parametrize("form", ["partial+delta", "delta", "partial"])
def test_attn_res_settle(dtype, n, form):
    """The decoder's fused step: P + delta written back exactly as torch adds, the site vector folded in-kernel."""
    from kestrel.ops.attn_res import reference as R, triton as K
    D = 64 if SMALL else 2048
    bank = [rnd(5, D, dtype=dtype) for _ in range(n)]
    p = rnd(5, D, dtype=dtype) if form != "delta" else None
    d = rnd(5, D, dtype=dtype) if form != "partial" else None
    kn, kp, nw = rnd(D, dtype=dtype), rnd(D, dtype=dtype, scale=D**-0.5), rnd(D, dtype=dtype)
    p1, z1 = K.attn_res_settle(bank, p, d, kn, kp, 1e-5, nw, 1e-6)
    p2, z2 = R.attn_res_settle(bank, p, d, kn, kp, 1e-5, nw, 1e-6)
    # reading the bank and the partial sum before waiting for delta computes the same (the ordering under PDL is
    # what test_pdl_graph_decode_bit_equals_plain_launches checks, in the model)
    p3, z3 = K.attn_res_settle(bank, p, d, kn, kp, 1e-5, nw, 1e-6, early=True)
    assert torch.equal(p3, p1) and torch.equal(z3, z1)
    if INTERPRET and dtype == torch.bfloat16:  # the interpreter truncates instead of rounding to bf16
        assert rel(p1, p2) < TOL[dtype]
    else:
        assert torch.equal(p1, p2)
    assert rel(z1, z2) < TOL[dtype]


def _beta(shape, logits: bool, dtype):
    """beta in (0, 1), or (logits) row-strided beta logits in the activation dtype, as the fused projection gives."""
    if not logits:
        return torch.rand(*shape, device=DEV)
    return rnd(*shape[:-1], 3 * shape[-1], dtype=dtype)[..., 1 : 1 + shape[-1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("channels_first", [False, True])
def test_kda_decode(dtype, lower_bound, logits, channels_first, monkeypatch):
    from kestrel.ops.kda import reference as R, triton as K, triton_conv
    monkeypatch.setattr(triton_conv, "CHANNELS_FIRST", channels_first)
    B, H, Kd, W, S = (3, 2, 16, 4, 6) if SMALL else (33, 16, 128, 4, 40)
    mixed, cw = rnd(B, 3 * H * Kd, dtype=dtype), rnd(3 * H * Kd, W, dtype=dtype, scale=0.5)
    conv, ssm = rnd(S, W - 1, 3 * H * Kd, dtype=dtype), rnd(S, H, Kd, Kd)
    slots = torch.randperm(S - 1, device=DEV)[:B] + 1
    raw, A, dtb, beta = rnd(B, H, Kd, dtype=dtype), rnd(H), rnd(H * Kd), _beta((B, H), logits, dtype)
    c1, s1, c2, s2 = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    o1 = R.kda_decode(mixed, cw, c1, s1, slots, raw, A, dtb, lower_bound, beta, Kd**-0.5, logits)
    o2 = K.kda_decode(mixed, cw, c2, s2, slots, raw, A, dtb, lower_bound, beta, Kd**-0.5, logits)
    assert rel(o2, o1) < TOL[dtype] and rel(s2, s1) < STATE_TOL[dtype] and rel(c2, c1) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_decode_computes_the_output_gate(dtype):
    """out_gate: the decode's recurrence launch also writes sigmoid(out_gate) in fp32 (one program a head, beside
    the recurrence; the gate a row-strided view of a wider projection output). Outputs, states and conv tails stay
    bit-equal to a decode without it, the gate matches torch's sigmoid, and the o_proj GEMV's gated-RMSNorm prologue
    reading it ("gated_rms_sig") gives bit-for-bit what it gives computing the sigmoid itself."""
    from kestrel.ops.kda import triton as K
    from kestrel.ops.linear import Prologue, triton as LK
    from kestrel.ops.norm import reference as NR
    B, H, Kd, W, S, N = (3, 2, 16, 4, 6, 40) if SMALL else (5, 16, 128, 4, 12, 2048)
    mixed, cw = rnd(B, 3 * H * Kd, dtype=dtype), rnd(3 * H * Kd, W, dtype=dtype, scale=0.5)
    conv, ssm = rnd(S, W - 1, 3 * H * Kd, dtype=dtype), rnd(S, H, Kd, Kd)
    slots = torch.randperm(S - 1, device=DEV)[:B] + 1
    raw, A, dtb, b = rnd(B, H, Kd, dtype=dtype), rnd(H), rnd(H * Kd), rnd(B, H, dtype=dtype)
    og = rnd(B, H * Kd + 24, dtype=dtype)[:, 8 : 8 + H * Kd]
    c1, s1, c2, s2 = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    o1 = K.kda_decode(mixed, cw, c1, s1, slots, raw, A, dtb, -5.0, b, Kd**-0.5, True)
    o2, sg = K.kda_decode(mixed, cw, c2, s2, slots, raw, A, dtb, -5.0, b, Kd**-0.5, True, out_gate=og)
    assert torch.equal(o2, o1) and torch.equal(s2, s1) and torch.equal(c2, c1)
    assert sg is not None and sg.dtype == torch.float32 and sg.shape == (B, H * Kd)
    assert rel(sg, torch.sigmoid(og.double())) < 1e-6
    o2d, w, wo = o2.reshape(B, H * Kd), rnd(Kd, dtype=dtype), rnd(N, H * Kd, dtype=dtype, scale=(H * Kd) ** -0.5)
    apply = lambda: NR.gated_rms_norm(o2, og.reshape(B, H, Kd), w, 1e-6).reshape(B, H * Kd)  # noqa: E731
    for m in (1, B):  # one row (the decode GEMV), and several
        x = o2d[:m]
        ref = LK.linear(x, wo, None, Prologue("gated_rms", x, other=og[:m], weight=w, eps=1e-6, group=Kd,
                                              apply=apply))
        got = LK.linear(x, wo, None, Prologue("gated_rms_sig", x, other=sg[:m], weight=w, eps=1e-6, group=Kd,
                                              apply=apply))
        assert torch.equal(got, ref), m
    # a gate that is not [B, H * V] with unit column stride: not computed
    assert K.kda_decode(mixed, cw, conv.clone(), ssm.clone(), slots, raw, A, dtb, -5.0, b, Kd**-0.5, True,
                        out_gate=og.t().contiguous().t())[1] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("prefetch,tail_in_recur,channels_first", [(False, True, False), (True, True, False),
                                                                    (True, False, False), (True, True, True)])
def test_kda_verify_and_fold(dtype, lower_bound, logits, prefetch, tail_in_recur, channels_first, monkeypatch):
    """The Triton verify against the reference verify; the Triton fold against the reference fold; and ReplaySSM's
    invariant on the kernels themselves: verify + fold of any accepted prefix leaves the conv tail and the state
    bit-identical to decoding those tokens one by one with the decode kernel (snapshots inside the window too).
    The recurrence over a block's steps as a loop, and unrolled with each step's inputs loaded a step ahead (with
    the block's rows strided, as columns of a wider projection output, which the verify reads in place); the steps
    past a block's length output zeros. The fold's conv tails in the recurrence's launch and in their own."""
    from kestrel.ops.kda import reference as R, triton as K, triton_conv
    monkeypatch.setattr(triton_conv, "CHANNELS_FIRST", channels_first)
    monkeypatch.setattr(K, "RECUR_PREFETCH", prefetch)
    monkeypatch.setattr(K, "FOLD_TAIL_IN_RECUR", tail_in_recur)
    monkeypatch.setattr(K, "RECUR_PREFETCH_MAX_K", 1 << 20)
    B, H, Kd, W, S, L = (3, 2, 16, 4, 12, 5) if SMALL else (9, 16, 128, 4, 30, 8)
    C = 3 * H * Kd
    x, cw = rnd(B, L, C, dtype=dtype), rnd(C, W, dtype=dtype, scale=0.5)
    if prefetch:  # the fused projection's columns: rows C + 40 apart
        x = torch.cat([rnd(B, L, 24, dtype=dtype), x, rnd(B, L, 16, dtype=dtype)], -1)[..., 24 : 24 + C]
        assert x.stride(1) == C + 40
    conv, ssm = rnd(S, W - 1, C, dtype=dtype), rnd(S, H, Kd, Kd)
    slots = torch.randperm(S // 2 - 1, device=DEV)[:B] + 1
    snap_slots = torch.randperm(S // 2, device=DEV)[:B] + S // 2
    raw, A, dtb, beta = rnd(B, L, H, Kd, dtype=dtype), rnd(H), rnd(H * Kd), _beta((B, L, H), logits, dtype)
    lens = torch.randint(1, L + 1, (B,)).tolist()
    lens[0] = L - 1  # at least one padding step
    lens[1] = 0  # a padding block (a graph's rows past the batch): outputs zeros, commits nothing
    commit = [torch.randint(1, n + 1, ()).item() if n else 0 for n in lens]
    snaps = [(torch.randint(1, c + 1, ()).item(), int(snap_slots[i])) if i % 2 == 0 and c else None
             for i, c in enumerate(commit)]

    def run(impl, conv_s, ssm_s):
        o, rec = impl.kda_verify(x, raw, beta, lens, cw, conv_s, ssm_s, slots, A, dtb, lower_bound, Kd**-0.5,
                                 beta_logits=logits)
        return o, rec

    c_ref, s_ref, c_k, s_k = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    o_ref, rec_ref = run(R, c_ref, s_ref)
    o_k, rec_k = run(K, c_k, s_k)
    assert torch.equal(c_k, conv) and torch.equal(s_k, ssm), "verify wrote the committed state"
    valid = torch.arange(L, device=DEV)[None, :] < torch.tensor(lens, device=DEV)[:, None]
    assert rel(o_k[valid], o_ref[valid]) < TOL[dtype]
    assert bool((o_k[~valid] == 0).all()) and not bool(valid.all())
    for name in ("k", "v", "g", "beta"):  # past a block's length the kernel keeps real inputs, the reference zeros
        assert rel(getattr(rec_k, name)[valid], getattr(rec_ref, name)[valid]) < TOL[dtype], name
    c_t, s_t = c_k.clone(), s_k.clone()
    R.kda_fold(rec_ref, c_ref, s_ref, slots, commit, snaps)
    K.kda_fold(rec_k, c_k, s_k, slots, torch.tensor(commit, device=DEV), snaps)
    # the device form of the snapshots (steps, slot tensors; 0 steps = none), as a CUDA graph's fold passes them
    steps = torch.tensor([0 if s is None else s[0] for s in snaps], dtype=torch.int32, device=DEV)
    K.kda_fold(rec_k, c_t, s_t, slots, torch.tensor(commit, device=DEV), (steps, snap_slots.to(torch.int32)))
    assert torch.equal(c_t, c_k) and torch.equal(s_t, s_k), "device-form snapshots differ from the list form"
    touched = torch.cat([slots, snap_slots[::2]])
    assert rel(s_k[touched], s_ref[touched]) < STATE_TOL[dtype], ("state", rel(s_k[touched], s_ref[touched]))
    assert rel(c_k[touched], c_ref[touched]) < TOL[dtype], ("conv", rel(c_k[touched], c_ref[touched]))
    # bit-exact against the decode kernel, token by token
    c_d, s_d = conv.clone(), ssm.clone()
    for t in range(max(commit)):
        rows = [i for i in range(B) if t < commit[i]]
        idx = torch.tensor(rows, device=DEV)
        o_d = K.kda_decode(x[idx, t], cw, c_d, s_d, slots[idx], raw[idx, t], A, dtb, lower_bound, beta[idx, t],
                           Kd**-0.5, logits)
        assert torch.equal(o_d, o_k[idx, t]), f"verify output differs from decode at step {t}: {rel(o_k[idx, t], o_d)}"
        for i in rows:
            if snaps[i] is not None and snaps[i][0] == t + 1:
                assert torch.equal(s_k[snaps[i][1]], s_d[slots[i]]) and torch.equal(c_k[snaps[i][1]], c_d[slots[i]])
    assert torch.equal(c_k[slots], c_d[slots]), ("conv tails", rel(c_k[slots], c_d[slots]))
    assert torch.equal(s_k[slots], s_d[slots]), ("states", rel(s_k[slots], s_d[slots]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("L", [1, 5])
def test_kda_prep_channels_first_equals_taps_first(dtype, W, L, monkeypatch):
    """The prep kernel's two forms (triton_conv.CHANNELS_FIRST): the conv tails, v, the gates and beta bit-equal
    (the same roundings in the same order), q and k within rounding (their L2 norms' reductions may differ)."""
    from kestrel.ops.kda import triton_conv
    B, H, Kd, S = (3, 2, 16, 6) if SMALL else (5, 16, 128, 12)
    C = 3 * H * Kd
    x = rnd(B, L, C + 8, dtype=dtype)[..., 8:]  # rows strided, as the fused projection's columns
    cw, conv = rnd(C, W, dtype=dtype, scale=0.5), rnd(S, W - 1, C, dtype=dtype)
    slots = torch.randperm(S - 1, device=DEV)[:B] + 1
    raw, A, dtb, blog = rnd(B, L, H, Kd, dtype=dtype), rnd(H), rnd(H * Kd), rnd(B * L, H, dtype=dtype)
    out = {}
    for cf in (False, True):
        monkeypatch.setattr(triton_conv, "CHANNELS_FIRST", cf)
        c = conv.clone()
        out[cf] = (c, *triton_conv.launch_prep(x, cw, c, slots, raw, A, dtb, -5.0, Kd**-0.5, H, Kd, Kd,
                                               write_tail=L == 1, beta_logits=blog))
    (c0, q0, k0, v0, g0, b0), (c1, q1, k1, v1, g1, b1) = out[False], out[True]
    assert torch.equal(c0, c1) and torch.equal(v0, v1) and torch.equal(g0, g1) and torch.equal(b0, b1)
    assert rel(q1, q0) < TOL[dtype] and rel(k1, k0) < TOL[dtype]
    if L == 1:
        assert not torch.equal(c0, conv)  # the tail moved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device_snaps", [False, True])
def test_kda_fold_layers_in_one_launch(dtype, device_snaps):
    """Several layers' folds in one launch (kda_fold_layers) leave every layer's state, conv tail and snapshots
    bit-identical to one fold launch a layer; layers whose tensors differ in layout fold one launch each."""
    from kestrel.ops.kda import triton as K
    B, H, Kd, W, S, L, NL = (3, 2, 16, 4, 12, 5, 3) if SMALL else (5, 16, 128, 4, 20, 8, 4)
    C = 3 * H * Kd
    cw, A, dtb = rnd(C, W, dtype=dtype, scale=0.5), rnd(H), rnd(H * Kd)
    slots = torch.randperm(S // 2 - 1, device=DEV)[:B] + 1
    snap_slots = torch.randperm(S // 2, device=DEV)[:B] + S // 2
    lens = torch.randint(1, L + 1, (B,)).tolist()
    commit = [torch.randint(0, n + 1, ()).item() for n in lens]
    snaps = [(torch.randint(1, c + 1, ()).item(), int(snap_slots[i])) if i % 2 == 0 and c else None
             for i, c in enumerate(commit)]
    if device_snaps:
        snaps = (torch.tensor([0 if s is None else s[0] for s in snaps], dtype=torch.int32, device=DEV),
                 snap_slots.to(torch.int32))
    convs, ssms, recs = [], [], []
    for _ in range(NL):  # each layer its own inputs and committed state
        conv, ssm = rnd(S, W - 1, C, dtype=dtype), rnd(S, H, Kd, Kd)
        x, raw = rnd(B, L, C, dtype=dtype), rnd(B, L, H, Kd, dtype=dtype)
        _, rec = K.kda_verify(x, raw, _beta((B, L, H), True, dtype), lens, cw, conv, ssm, slots, A, dtb, -5.0,
                              Kd**-0.5, beta_logits=True)
        convs.append(conv)
        ssms.append(ssm)
        recs.append(rec)
    commit_t = torch.tensor(commit, device=DEV)
    orig_c, orig_s = [c.clone() for c in convs], [m.clone() for m in ssms]
    one_c, one_s = [c.clone() for c in convs], [m.clone() for m in ssms]
    K.kda_fold_layers(recs, one_c, one_s, slots, commit_t, snaps)
    for rec, c, m in zip(recs, convs, ssms):
        K.kda_fold(rec, c, m, slots, commit_t, snaps)
    for layer in range(NL):
        assert torch.equal(one_s[layer], ssms[layer]), ("state", layer)
        assert torch.equal(one_c[layer], convs[layer]), ("conv tail", layer)
    assert any(c for c in commit), "nothing folded"
    # a layer whose state pool has another slot stride: one launch a layer, the same bits
    odd = torch.empty(S, H * Kd * Kd + 64, device=DEV)[:, : H * Kd * Kd].view(S, H, Kd, Kd)
    odd.copy_(orig_s[1])
    odd_s, odd_c = [orig_s[0].clone(), odd] + [m.clone() for m in orig_s[2:]], [c.clone() for c in orig_c]
    K.kda_fold_layers(recs, odd_c, odd_s, slots, commit_t, snaps)
    for layer in range(NL):
        assert torch.equal(odd_s[layer], ssms[layer]) and torch.equal(odd_c[layer], convs[layer]), ("odd", layer)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_kda_chunked(dtype):
    from kestrel.ops.kda import reference as R
    from kestrel.ops.kda.triton_chunk import kda_chunked
    H, Kd, V = (2, 16, 32) if SMALL else (4, 128, 128)
    lens, starts = ([70, 5, 130], [0, 60, 100]) if SMALL else ([700, 5, 1030, 64], [0, 60, 100, 128])
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    T = cu[-1]
    q, k = R.l2norm(rnd(T, H, Kd)).to(dtype), R.l2norm(rnd(T, H, Kd)).to(dtype)
    v = rnd(T, H, V, dtype=dtype)
    g = -5 * torch.rand(T, H, Kd, device=DEV)  # safe gates at their bound: a 64-token chunk sums to ~ -160..-320
    beta, h0 = torch.rand(T, H, device=DEV), rnd(len(lens), H, Kd, V)
    o, f, cs = kda_chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, start_positions=starts,
                           output_chunk_states=True)
    d = torch.float64
    ro, rf, rcs = R.kda_chunked(q.to(d), k.to(d), v.to(d), g.to(d), beta.to(d), cu_seqlens=cu, initial_state=h0.to(d),
                                start_positions=starts, output_chunk_states=True)
    assert rel(o, ro) < TOL[dtype] and rel(f, rf) < TOL[dtype]
    for (p, s), (rp, rs) in zip(cs, rcs):
        assert p == rp and rel(s, rs) < TOL[dtype]
    # no initial state, one sequence: softplus-sized gates, then gates near zero, so that every 16 x 16 block of
    # a chunk (down to rows 48.. against columns ..15) carries weight in the output
    for g2 in (-torch.rand(T, H, Kd, device=DEV), -0.02 * torch.rand(T, H, Kd, device=DEV)):
        o, f = kda_chunked(q, k, v, g2, beta)
        ro, rf = R.kda_chunked(q.to(d), k.to(d), v.to(d), g2.to(d), beta.to(d))
        assert rel(o, ro) < TOL[dtype] and rel(f, rf) < TOL[dtype]
    # the same call with q at an address that is not 16-byte aligned: launch() keys its compiled kernels on
    # alignment, so this compiles its own variant (with a kernel specialised for aligned q it would read wrong data
    # or fault); on CUDA the calls above already went through the compiled kernels' launchers
    qm = torch.empty(q.numel() + 1, dtype=dtype, device=DEV)[1:].view_as(q).copy_(q)
    o2, f2 = kda_chunked(qm, k, v, g2, beta)
    assert rel(o2, ro) < TOL[dtype] and rel(f2, rf) < TOL[dtype]
    if DEV == "cuda" and not INTERPRET:
        from kestrel.ops.triton_utils import _COMPILED
        assert {key[2][0] for key in _COMPILED if key[0].__name__ == "_diag_kernel"} >= {(dtype, True), (dtype, False)}


def test_launch_keys_on_what_triton_specialises():
    """launch() reuses a compiled kernel only for arguments Triton would have compiled the same way: a tensor's dtype
    and 16-byte alignment, an int's value class (1, a multiple of 16, beyond int32), other values by type."""
    from kestrel.ops.triton_utils import _spec
    base = torch.empty(64, dtype=torch.bfloat16, device=DEV)
    assert _spec(base) == _spec(base[8:]) != _spec(base[1:])  # 16 bytes in is aligned, 2 is not
    assert _spec(base) != _spec(base.float())
    assert len({_spec(1), _spec(2), _spec(32), _spec(2**31), _spec(3)}) == 4 and _spec(2) == _spec(3)
    assert _spec(True) != _spec(1) and _spec(0.5) == _spec(2.0) and _spec(None) != _spec(0)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_mla_decode(dtype, page_size, monkeypatch):
    from kestrel.ops.mla import reference as R, triton as K
    B, H, Rk, Dr, P = (3, 4, 32, 8, 64) if SMALL else (5, 16, 512, 64, 4096)
    lens = torch.tensor([5, 33, 1] if SMALL else [1, 17, 300, 2000, 4000], device=DEV)
    maxp = -(-int(lens.max()) // page_size)
    pt = torch.stack([torch.randperm(P - 1, device=DEV)[:maxp] + 1 for _ in range(B)]).int()
    kv = rnd(P, page_size, Rk + Dr, dtype=dtype)
    # q_rope as the model has it: the last columns of each head's query, read in place by the kernel
    ql, qr = rnd(B, H, Rk, dtype=dtype), rnd(B, H, 24 + Dr, dtype=dtype)[..., 24:]
    o1, l1 = R.mla_decode_paged(ql, qr, kv, pt, lens, Rk, 0.07)
    o2, l2 = K.mla_decode_paged(ql, qr, kv, pt, lens, Rk, 0.07)
    assert rel(o2, o1) < TOL[dtype] and rel(l2, l1) < TOL[dtype]
    # the first block of keys read before the wait, the newest key after it: the same values in the same order
    monkeypatch.setattr(K, "EARLY_KV", not K.EARLY_KV)
    o6, l6 = K.mla_decode_paged(ql, qr, kv, pt, lens, Rk, 0.07)
    assert torch.equal(o6, o2) and torch.equal(l6, l2)
    # a verify block's form: query rows 2 b and 2 b + 1 read table row b in place (rows of a wider table), as the
    # table repeated row by row reads it, each over its own key count
    Bt = max(1, B // 2)
    wide = torch.cat([pt, pt], 1)[:Bt, : pt.shape[1]]
    lens2 = (lens[:Bt].repeat_interleave(2) - torch.tensor([0, 1] * Bt, device=DEV)).clamp_min(1)
    o3, l3 = K.mla_decode_paged(ql[: 2 * Bt], qr[: 2 * Bt], kv, wide, lens2, Rk, 0.07, rows_per_table=2)
    o4, l4 = R.mla_decode_paged(ql[: 2 * Bt], qr[: 2 * Bt], kv, pt[:Bt].repeat_interleave(2, 0), lens2, Rk, 0.07)
    assert rel(o3, o4) < TOL[dtype] and rel(l3, l4) < TOL[dtype]
    # fp64 goes to the reference, which reads the table repeated row by row
    o5, l5 = K.mla_decode_paged(ql[: 2 * Bt].double(), qr[: 2 * Bt].double(), kv.double(), wide, lens2, Rk, 0.07,
                                rows_per_table=2)
    assert o5.dtype == torch.float64 and rel(o5, o4) < TOL[dtype] and rel(l5, l4) < TOL[dtype]


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("B", [1, 3])
def test_mla_decode_project(dtype, B):
    """The paged decode's split results merged inside the W_uv head GEMV (mla_decode_project) against the decode's
    combine kernel and the head GEMV after it (the same merge and roundings: equal up to the merge's summation
    order) and against the reference; rows the kernel does not take (too many) go the two-launch way."""
    from kestrel.ops.mla import reference as R, triton as K
    H, Rk, Dr, Dv, P, ps = (3, 32, 8, 24, 64, 4) if SMALL else (16, 512, 64, 128, 512, 16)
    lens = torch.tensor(([5, 33, 1] if SMALL else [17, 300, 2000])[:B], device=DEV)
    maxp = -(-int(lens.max()) // ps) + 1
    pt = torch.stack([torch.randperm(P - 1, device=DEV)[:maxp] + 1 for _ in range(B)]).int()
    kv = rnd(P, ps, Rk + Dr, dtype=dtype)
    w_uv = rnd(H, Dv, Rk, dtype=dtype, scale=Rk**-0.5)
    ql, qr = rnd(B, H, Rk, dtype=dtype), rnd(B, H, 24 + Dr, dtype=dtype)[..., 24:]
    y = K.mla_decode_project(ql, qr, kv, pt, lens, Rk, 0.07, w_uv)
    two = K.head_gemv(K.mla_decode_paged(ql, qr, kv, pt, lens, Rk, 0.07)[0], w_uv)
    ref = R.head_gemv(R.mla_decode_paged(ql, qr, kv, pt, lens, Rk, 0.07)[0], w_uv)
    assert y.shape == (B, H, Dv) and y.dtype == dtype
    assert rel(y, two) < (1e-6 if dtype == torch.float32 else 1e-2) and rel(y, ref) < TOL[dtype]
    many = K.HEAD_GEMV_MAX_ROWS + 1
    qlm, qrm = rnd(many, H, Rk, dtype=dtype), rnd(many, H, Dr, dtype=dtype)
    ptm, lm = pt[:1].repeat(many, 1), lens[:1].repeat(many)
    assert torch.equal(K.mla_decode_project(qlm, qrm, kv, ptm, lm, Rk, 0.07, w_uv),
                       K.head_gemv(K.mla_decode_paged(qlm, qrm, kv, ptm, lm, Rk, 0.07)[0], w_uv))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 7])
def test_head_gemv(dtype, T):
    from kestrel.ops.mla import reference as R, triton as K
    H, Dn, Rk, Dv = (3, 16, 32, 24) if SMALL else (16, 128, 512, 128)
    w = rnd(H, Dn + Dv, Rk, dtype=dtype)  # kv_b_proj's weight per head: [W_uk; W_uv]
    w_uk, w_uv = w[:, :Dn], w[:, Dn:]
    q = rnd(T, H, Dn + 8, dtype=dtype)[..., :Dn]  # q_nope: the first columns of each head's query
    # absorb in (W_uk read transposed, in place) and out (W_uv's rows), as MLA decode runs them
    assert rel(K.head_gemv(q, w_uk.transpose(1, 2)), R.head_gemv(q, w_uk.transpose(1, 2))) < TOL[dtype]
    lat = rnd(T, H, Rk, dtype=dtype)
    assert rel(K.head_gemv(lat, w_uv), R.head_gemv(lat, w_uv)) < TOL[dtype]
    # a small weight gives each row its own programs: the same values, each row as a one-row call computes it
    small = w_uv[:2, :8]
    y = K.head_gemv(lat[:, :2], small)
    assert rel(y, R.head_gemv(lat[:, :2], small)) < TOL[dtype]
    for t in range(T):
        assert torch.equal(y[t], K.head_gemv(lat[t : t + 1, :2], small)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [None, torch.float32])
def test_store_latent(dtype, cache_dtype):
    from kestrel.ops.mla import reference as R, triton as K
    T, Rk, Dr, P, ps = (5, 32, 8, 6, 4) if SMALL else (37, 512, 64, 40, 16)
    cache_dtype = cache_dtype or dtype
    wide = rnd(T, 24 + Rk + Dr + 16, dtype=dtype)  # kv_a as the middle columns of a fused GEMM's output
    kv_a = wide[:, 24 : 24 + Rk + Dr]
    w = rnd(Rk, dtype=dtype)
    loc = torch.randperm(P * ps, device=DEV)[:T]
    bufs = [torch.full((P, ps, Rk + Dr), 7.0, dtype=cache_dtype, device=DEV) for _ in range(2)]
    R.store_latent(kv_a, w, 1e-6, Rk, bufs[0], loc)
    K.store_latent(kv_a, w, 1e-6, Rk, bufs[1], loc)
    flat = [b.view(-1, Rk + Dr) for b in bufs]
    assert rel(flat[1][loc], flat[0][loc]) < TOL[dtype]
    others = torch.ones(P * ps, dtype=torch.bool, device=DEV)
    others[loc] = False
    assert bool((flat[1][others] == 7.0).all()), "a slot outside loc was written"


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_with_lse(dtype, causal):
    from kestrel.ops.mla import reference as R, triton as K
    Tq, S, H, DK, DV = (37, 50, 2, 24, 16) if SMALL else (300, 1000, 16, 192, 128)
    q = rnd(Tq, H, DK, dtype=dtype)
    kv = rnd(S, H, DK + DV, dtype=dtype)
    k, v = kv[..., :DK], kv[..., DK:]
    o1, l1 = R.attention_with_lse(q, k, v, DK**-0.5, S - Tq, causal)
    o2, l2 = K.attention_with_lse(q, k, v, DK**-0.5, S - Tq, causal)
    assert rel(o2, o1) < TOL[dtype] and rel(l2, l1) < TOL[dtype]


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_varlen(dtype, causal):
    """Packed sequences (new tokens over cached prefixes of other lengths, one of a single token, one longer than a
    query block) in one launch: each sequence's rows as its own attention_with_lse gives them."""
    from kestrel.ops.mla import reference as R, triton as K
    H, DK, DV = (2, 24, 16) if SMALL else (16, 192, 128)
    ext, pre = ([5, 1, 19, 3], [0, 7, 4, 30]) if SMALL else ([64, 1, 200, 37], [0, 500, 64, 1000])
    cu_q, cu_k = [0], [0]
    for e, p in zip(ext, pre):
        cu_q.append(cu_q[-1] + e)
        cu_k.append(cu_k[-1] + e + p)
    q = rnd(cu_q[-1], H, DK, dtype=dtype)
    kv = rnd(cu_k[-1], H, DK + DV, dtype=dtype)
    k, v = kv[..., :DK], kv[..., DK:]
    o1, l1 = R.attention_varlen_with_lse(q, k, v, DK**-0.5, cu_q, cu_k, pre, causal)
    o2, l2 = K.attention_varlen_with_lse(q, k, v, DK**-0.5, cu_q, cu_k, pre, causal)
    assert rel(o2, o1) < TOL[dtype] and rel(l2, l1) < TOL[dtype]
    i = 2  # the reference is the per-sequence op
    o3, _ = R.attention_with_lse(q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]],
                                 DK**-0.5, pre[i], causal)
    assert torch.equal(o1[cu_q[i] : cu_q[i + 1]], o3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_kernel_is_torch_argmax(dtype):
    """The decode graph's argmax (one program per row) against torch.argmax: many ties (the first index wins),
    NaNs (the first NaN wins), infinities, a row of -inf, signed zeros, one column, a vocabulary-sized row on fresh
    random values; strided or too-wide rows are declined (torch serves them: ops.argmax on CUDA)."""
    from kestrel.ops import reduce_triton as K
    from tests.conftest import argmax_edge_rows

    x = argmax_edge_rows(dtype, DEV)
    big = rnd(3, 4096 if SMALL else 32000, dtype=dtype)
    for c in (x, x[:1], x[:, :1].contiguous(), x[:, 5:12], big):
        got = K.argmax(c)
        assert got.dtype == torch.long and torch.equal(got, c.argmax(-1))
    assert K.argmax(x[:, ::2]) is None and K.argmax(rnd(2, K.MAX_COLS + 1)) is None
    if DEV == "cuda":
        from kestrel.ops import argmax

        for c in (big, x[:, ::2]):
            assert torch.equal(argmax(c), c.argmax(-1))
