"""The MoE's Triton kernels (router, expert GEMVs, grouped GEMM, their fused forms) against their plain-torch
references on fresh random inputs (CUDA; or the Triton interpreter on CPU tensors with TRITON_INTERPRET=1, fp32
only where a kernel uses tl.dot, which the interpreter gets wrong in bf16)."""

import pytest
import torch

from tests.gpu.kernel_common import KERNEL_MARKS, DEV, SMALL, TOL, DOT_DTYPES, rel, rnd

pytestmark = KERNEL_MARKS


def test_route():
    from kestrel.ops.moe import reference as R, triton as K
    T, E, k = (5, 16, 4) if SMALL else (300, 128, 8)
    lg, bias = rnd(T, E), rnd(E, scale=0.1)
    w1, i1 = R.route(lg, bias, k, True, 2.5)
    w2, i2 = K.route(lg, bias, k, True, 2.5)
    assert torch.equal(i1.sort(1).values, i2.sort(1).values)
    assert rel(w2.gather(1, i2.argsort(1)), w1.gather(1, i1.argsort(1))) < 1e-6
    nan = torch.full((2, E), float("nan"), device=DEV)
    assert int(K.route(nan, bias, k, True, 2.5)[1].max()) < E
    # ties: the higher choice first, the lower id among equals (logits on a coarse grid, no bias)
    coarse = torch.randint(0, 3, (T, E), device=DEV).float()
    ids = K.route(coarse, None, k, False, 1.0)[1]
    want = torch.sort(-coarse, dim=1, stable=True).indices[:, :k]
    assert torch.equal(ids, want)


@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("ids_ready", [False, True])
def test_moe_experts_routed(quant, ids_ready, monkeypatch):
    """The expert kernels choosing the experts from the router logits: bit-equal to routing first (the same
    _route_row), on the GEMV path (1 and 3 tokens) and the routed-first path (40 tokens)."""
    from kestrel.ops.moe import reference as R, triton as K
    monkeypatch.setattr(K, "ROUTE_IN_KERNEL_MAX_TOKENS", 8)  # the kernels route 3 tokens too
    E, D, I, k = (16, 64, 32, 4) if SMALL else (128, 1024, 512, 8)
    dtype = torch.float32 if SMALL else torch.bfloat16
    ew = _experts(E, D, I, quant, dtype)
    act = R.Activation("situ", 4.0, 25.0)
    for bias in (None, rnd(E, scale=0.1)):
        routing = R.Routing(bias, k, True, 2.5)
        for T in (1, 3, 40):
            x, lg = rnd(T, D, dtype=dtype), rnd(T, E)
            w, ids = K.route(lg, bias, k, True, 2.5)
            if ids_ready and DEV == "cuda":
                # ids_ready: the routing has finished before the expert kernels start (under PDL they read it
                # before their wait; in the model a late-trigger launch sits between)
                torch.cuda.synchronize()
            ref = K.moe_experts(x, ew, w, ids, act, ids_ready)
            assert torch.equal(K.moe_experts_routed(x, ew, lg, routing, act, ids_ready), ref), (T, bias is None)


@pytest.mark.parametrize("kind", ["situ", "silu"])
def test_moe_up_activation_spread_over_threads(kind, monkeypatch):
    """The up GEMV's activation on one row a thread (ACT_SPREAD): bit-equal to every thread activating every row,
    for whole tiles loaded before the wait and for the K loop, one and several tokens, bf16 and fp32."""
    from kestrel.ops.moe import reference as R, triton as K
    E, D, I, k = (16, 64, 32, 4) if SMALL else (128, 1024, 512, 8)
    act = R.Activation(kind, 4.0, 25.0)
    for dtype in (torch.float32, torch.bfloat16):
        ew = _experts(E, D, I, False, dtype)
        for T, ids_ready in ((1, True), (1, False), (3, True)):
            x = rnd(T, D, dtype=dtype)
            w, ids = R.route(rnd(T, E), None, k, True, 2.5)
            monkeypatch.setattr(K, "ACT_SPREAD", False)
            ref = K.moe_experts(x, ew, w, ids, act, ids_ready=ids_ready)
            monkeypatch.setattr(K, "ACT_SPREAD", True)
            got = K.moe_experts(x, ew, w, ids, act, ids_ready=ids_ready)
            assert torch.equal(got, ref), (dtype, T, ids_ready)


@pytest.mark.parametrize("kind", ["situ", "silu"])
def test_moe_up_gemv_computes_the_shared_experts_activation(kind):
    """shared=(gate, up): the routed experts' up GEMV also writes the shared experts' act(gate, up) (row-strided
    views of a front-end GEMM's output, one to three tokens). The routed output is bit-equal to a launch without
    it, and the paired tail GEMV reading that activation as it is gives bit-for-bit what it gives computing the
    activation in its prologue; too few up programs to carry it: None, and the output unchanged."""
    from kestrel.ops.linear import Prologue, triton as LK
    from kestrel.ops.moe import reference as R, triton as K
    E, D, I, k, S, N = (16, 64, 32, 4, 48, 40) if SMALL else (128, 1024, 512, 8, 1024, 2048)
    act = R.Activation(kind, 4.0, 25.0)
    for dtype in (torch.float32, torch.bfloat16):
        ew = _experts(E, D, I, False, dtype)
        wa, wb = rnd(N, D, dtype=dtype, scale=D**-0.5), rnd(N, S, dtype=dtype, scale=S**-0.5)
        for T in (1, 3):
            x, lg = rnd(T, D, dtype=dtype), rnd(T, E)
            w, ids = R.route(lg, None, k, True, 2.5)
            front = rnd(T, 3 * S, dtype=dtype)
            a, b = front[:, S : 2 * S], front[:, 2 * S :]
            y = K.moe_experts(x, ew, w, ids, act, ids_ready=True)
            y2, a_b = K.moe_experts(x, ew, w, ids, act, ids_ready=True, shared=(a, b))
            assert torch.equal(y2, y) and a_b is not None and a_b.shape == (T, S), T
            assert rel(a_b, act(a.double(), b.double())) < TOL[dtype], T
            xa = rnd(T, D, dtype=dtype)
            prologue = Prologue("act", a, lambda: K.activate(act, a, b), other=b, act=act)
            ref = LK.linear_pair(xa, wa, None, a, wb, prologue)
            assert torch.equal(LK.linear_pair(xa, wa, None, a_b, wb, Prologue("none", a_b, lambda: a_b)), ref), T
        # a row too wide for the launch's programs (one element a thread): not carried
        wide = 32 * K.UP_WARPS * k * -(-I // K.GEMV_UP_ROWS[1]) + 1
        w, ids = R.route(rnd(1, E), None, k, True, 2.5)
        x = rnd(1, D, dtype=dtype)
        y2, none = K.moe_experts(x, ew, w, ids, act, shared=(rnd(1, wide, dtype=dtype), rnd(1, wide, dtype=dtype)))
        assert none is None and torch.equal(y2, K.moe_experts(x, ew, w, ids, act))


@pytest.mark.parametrize("routed", [False, True])
def test_moe_experts_up_and_down_in_one_launch(routed, monkeypatch):
    """The up and down GEMVs as one launch of ticketed programs (FUSED_UPDOWN): bit-equal to the two launches,
    launch after launch (each launch re-arms its counters), with the routing read or chosen in the kernel; on a GPU
    also replayed from a CUDA graph."""
    from kestrel.ops.moe import reference as R, triton as K
    monkeypatch.setattr(K, "ROUTE_IN_KERNEL_MAX_TOKENS", 8)
    E, D, I, k = (16, 64, 32, 4) if SMALL else (128, 1024, 512, 8)
    dtype = torch.float32 if SMALL else torch.bfloat16
    ew = _experts(E, D, I, False, dtype)
    act = R.Activation("situ", 4.0, 25.0)
    bias = rnd(E, scale=0.1)
    routing = R.Routing(bias, k, True, 2.5)
    for T in (1, 3):
        x, lg = rnd(T, D, dtype=dtype), rnd(T, E)
        w, ids = K.route(lg, bias, k, True, 2.5)
        if DEV == "cuda":
            torch.cuda.synchronize()  # ids_ready: the routing finished before the expert kernels start

        def call():
            if routed:
                return K.moe_experts_routed(x, ew, lg, routing, act, ids_ready=True)
            return K.moe_experts(x, ew, w, ids, act, ids_ready=True)

        monkeypatch.setattr(K, "FUSED_UPDOWN", False)
        ref = call()
        monkeypatch.setattr(K, "FUSED_UPDOWN", True)
        for _ in range(3):
            assert torch.equal(call(), ref), T
        assert int(ew._updown_sync.abs().sum()) == 0, ew._updown_sync
        if DEV == "cuda":
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = call()
            for _ in range(3):
                out.zero_()
                g.replay()
                assert torch.equal(out, ref), T


def _experts(E, D, I, quant, dtype):
    from kestrel.models.layers.linear import ExpertWeights
    from kestrel.ops.mxfp4 import reference as MX
    ew = ExpertWeights(E, D, I, quant, dtype).to(DEV)
    with torch.no_grad():
        for n, (o, i) in {"w1": (I, D), "w2": (D, I), "w3": (I, D)}.items():
            w = rnd(E, o, i, scale=i**-0.5)
            if quant:
                pk, sc = MX.quantize(w.flatten(0, 1))
                getattr(ew, n + "_packed").copy_(pk.view(E, o, -1))
                getattr(ew, n + "_scale").copy_(sc.view(E, o, -1))
            else:
                getattr(ew, n).copy_(w.to(dtype))
    return ew


@pytest.mark.parametrize("BM", [16, 64])
def test_moe_block_table_equals_the_torch_form(BM):
    """The grouped path's pair table (sort, run search, one block-table launch) against its torch form, on fresh
    routings: even, skewed onto a few experts, every pair on one expert, experts left empty, E not a power of 2."""
    from kestrel.ops.moe import triton_grouped as G

    g = torch.Generator().manual_seed(BM)
    for E, T, k, skew in ((8, 40, 2, False), (128, 300, 8, False), (128, 300, 8, True), (6, 33, 3, True),
                          (16, 50, 1, None)):
        if skew is None:
            ids = torch.full((T, k), 5, dtype=torch.long)
        elif skew:
            ids = torch.randint(0, 3, (T, k), generator=g) * (E // 3)
        else:
            ids = torch.rand(T, E, generator=g).argsort(-1)[:, :k]
        ids = ids.to(DEV)
        pairs, bexp = G.sort_pairs(ids, E, BM)
        want_pairs, want_bexp = G.sort_pairs_reference(ids, E, BM)
        assert torch.equal(bexp, want_bexp), (E, T, k, skew)
        assert torch.equal(pairs, want_pairs), (E, T, k, skew)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("kind", ["situ", "silu"])
def test_moe_experts(dtype, quant, kind):
    from kestrel.ops.moe import reference as R, triton as K
    E, D, I, k = (16, 64, 32, 4) if SMALL else (128, 1024, 512, 8)
    ew = _experts(E, D, I, quant, dtype)
    act = R.Activation(kind, 4.0, 25.0)
    for T in (1, 3, 40) if SMALL else (1, 8, 300):
        x = rnd(T, D, dtype=dtype)
        wts, ids = R.route(rnd(T, E), None, k, True, 2.5)
        ref = R.moe_experts(x, ew.dense("w1", dtype), ew.dense("w2", dtype), ew.dense("w3", dtype), wts, ids, act)
        assert rel(K.moe_experts(x, ew, wts, ids, act), ref) < TOL[dtype], T
        # ids_ready: the expert ids read and the weight tiles loaded before the wait (the decode path after a
        # late-trigger front GEMM)
        assert rel(K.moe_experts(x, ew, wts, ids, act, ids_ready=True), ref) < TOL[dtype], T
