"""The Triton GEMV (`kestrel/ops/linear/triton.py`) against torch and against its own one-row launches: stacked
layers, prologues, pairs, the row grid, the dispatch between GEMV and cuBLAS (see kernel_common for where these
run)."""

import pytest
import torch

from tests.gpu.kernel_common import KERNEL_MARKS, INTERPRET, SMALL, TOL, rel, rnd

pytestmark = KERNEL_MARKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3])
def test_linear_stacked(dtype, M):
    """Two layers over adjacent column groups of one row-strided input, stacked in one weight: one GEMV launch
    bit-equal to each layer's own GEMV."""
    from kestrel.ops.linear import linear_stacked, triton as K
    N, Kd = (40, 24) if SMALL else (2048, 128)
    buf = rnd(M, 5 * Kd, dtype=dtype)
    x = buf[:, Kd : 3 * Kd]  # two groups of Kd columns, row stride 5 Kd
    w = rnd(2 * N, Kd, dtype=dtype, scale=Kd**-0.5)
    y = K.linear(x, w, groups=2)
    assert torch.equal(y[:, :N], K.linear(x[:, :Kd].contiguous(), w[:N]))
    assert torch.equal(y[:, N:], K.linear(x[:, Kd:].contiguous(), w[N:]))
    a, b = linear_stacked(x, w, 2)  # the dispatcher: fused at one row, separate layers otherwise
    assert rel(a, x[:, :Kd].float() @ w[:N].float().T) < TOL[dtype]
    assert rel(b, x[:, Kd:].float() @ w[N:].float().T) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("kind", ["situ", "silu", "rms", "gated_rms", "gate"])
def test_linear_prologue(dtype, M, kind):
    """The GEMV building its input (activation, RMSNorm, KDA's per-head gated norm, MLA's output gate) from
    row-strided views of the previous op's outputs, against the unfused ops then the GEMV: SiTU (the activation
    kernel's own function) bit-equal; torch's sigmoid formulas and the norms (reductions ordered differently)
    within rounding."""
    from kestrel.ops.linear import Prologue, triton as K
    from kestrel.ops.moe import Activation
    from kestrel.ops.moe import triton as MK
    from kestrel.ops.norm import triton as NK
    N, Kd, group = (40, 64, 16) if SMALL else (2048, 2048, 128)
    buf = rnd(M, 3 * Kd, dtype=dtype)
    x, other = buf[:, :Kd], buf[:, 2 * Kd :]  # row stride 3 Kd, like the split outputs of a fused GEMM
    nw = rnd(Kd if kind == "rms" else group, dtype=dtype)
    w, add = rnd(N, Kd, dtype=dtype, scale=Kd**-0.5), rnd(M, N, dtype=dtype)
    act = Activation("situ" if kind == "situ" else "silu", 4.0, 25.0)
    if kind in ("situ", "silu"):
        pro = Prologue("act", x, lambda: MK.activate(act, x, other), other=other, act=act)
    elif kind == "gate":
        pro = Prologue("gate", x, lambda: x * torch.sigmoid(other), other=other)
    elif kind == "rms":
        pro = Prologue("rms", x, lambda: NK.rms_norm(x, nw, 1e-6), weight=nw, eps=1e-6)
    else:
        pro = Prologue("gated_rms", x, other=other, weight=nw, eps=1e-6, group=group,
                       apply=lambda: NK.gated_rms_norm(x.reshape(M, -1, group), other.reshape(M, -1, group), nw,
                                                      1e-6).reshape(M, Kd))
    fused, unfused = K.linear(x, w, add, pro), K.linear(pro.apply(), w, add)
    exact = kind == "situ" and not (INTERPRET and dtype == torch.bfloat16)
    if exact:
        assert torch.equal(fused, unfused)
    else:
        assert rel(fused, unfused) < TOL[dtype]
    # and the dispatcher serves one row with the fused GEMV, more rows with the ops one by one
    from kestrel.ops import linear as L
    assert rel(L.linear_with(pro, w, add), unfused) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("kb", ["same", "wider"])
def test_linear_pair(dtype, M, kb):
    """Two GEMVs summed into one output (the latent MoE's up projection with its RMSNorm prologue, the shared
    experts' down projection with the SiTU prologue) in one launch: bit-equal to the first GEMV, then the second
    adding the first's output in its epilogue; and a second input wider than the first."""
    from kestrel.ops import linear as L
    from kestrel.ops.linear import Prologue, triton as K
    from kestrel.ops.moe import Activation
    from kestrel.ops.moe import triton as MK
    from kestrel.ops.norm import triton as NK
    N, KA = (40, 32) if SMALL else (2048, 1024)
    KB = KA if kb == "same" else 2 * KA
    xa, nw = rnd(M, KA, dtype=dtype), rnd(KA, dtype=dtype)
    buf = rnd(M, 3 * KB, dtype=dtype)
    a, b = buf[:, :KB], buf[:, 2 * KB :]  # row-strided views, like the split outputs of the front GEMM
    wa, wb = rnd(N, KA, dtype=dtype, scale=KA**-0.5), rnd(N, KB, dtype=dtype, scale=KB**-0.5)
    act = Activation("situ", 4.0, 25.0)
    pro_a = Prologue("rms", xa, lambda: NK.rms_norm(xa, nw, 1e-6), weight=nw, eps=1e-6)
    pro_b = Prologue("act", a, lambda: MK.activate(act, a, b), other=b, act=act)
    assert K.fits_pair(N, KA, KB)
    y = K.linear_pair(xa, wa, pro_a, a, wb, pro_b)
    two = K.linear(a, wb, K.linear(xa, wa, None, pro_a), pro_b)
    if kb == "same" and not (INTERPRET and dtype == torch.bfloat16):
        assert torch.equal(y, two)
    else:  # a wider second tile may take other warps than its own launch (and the interpreter truncates bf16)
        assert rel(y, two) < TOL[dtype]
    ref = torch.nn.functional.linear(pro_b.apply().float(), wb.float()) + torch.nn.functional.linear(
        pro_a.apply().float(), wa.float())
    assert rel(y, ref) < TOL[dtype]
    # the dispatcher: one launch at one row, the two GEMVs (or ops) otherwise; the same sums either way
    assert rel(L.linear_pair(pro_a, wa, pro_b, wb), two) < TOL[dtype]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the dispatcher serves CUDA tensors only")
def test_linear_dispatch_rows_by_weight_size():
    """The dispatcher: up to GEMV_MAX_M (four) rows on the GEMV for any weight; up to eight rows for a small
    (launch-bound) weight; a large weight's five or eight rows on cuBLAS."""
    from kestrel.ops import linear as L
    from kestrel.ops.linear import reference as R, triton as K
    x = rnd(8, 256, dtype=torch.bfloat16)
    small, large = rnd(1024, 256, dtype=torch.bfloat16), rnd(8192, 256, dtype=torch.bfloat16)
    assert small.numel() <= L.SMALL_WEIGHT < large.numel()
    assert torch.equal(L.linear(x, small), K.linear(x, small))
    assert torch.equal(L.linear(x, large), R.linear(x, large))
    assert torch.equal(L.linear(x[:1], large), K.linear(x[:1], large))
    assert L.GEMV_MAX_M == 4
    for m in (2, 4):
        assert torch.equal(L.linear(x[:m], large), K.linear(x[:m], large))
    assert torch.equal(L.linear(x[:5], large), R.linear(x[:5], large))
    x9 = rnd(9, 256, dtype=torch.bfloat16)
    assert torch.equal(L.linear(x9, small), R.linear(x9, small))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [2, 4])
def test_linear_row_grid_for_large_weights(dtype, M, monkeypatch):
    """A large weight's rows in programs of their own (the rows on grid axis 0): every row bit-equal to a one-row
    launch, for the GEMV with and without a prologue and for the pair; against torch within rounding."""
    from kestrel.ops.linear import Prologue, triton as K
    from kestrel.ops.moe import Activation
    from kestrel.ops.moe import triton as MK
    from kestrel.ops.norm import triton as NK
    monkeypatch.setattr(K, "ROW_GRID_LARGE_MAX_M", 8)
    N, Kd = (40, 96) if SMALL else (3000, 1024)
    x, w = rnd(M, Kd, dtype=dtype), rnd(N, Kd, dtype=dtype, scale=Kd**-0.5)
    assert SMALL or K._row_grid(M, w) == 2
    y = K.linear(x, w)
    assert rel(y, torch.nn.functional.linear(x.float(), w.float())) < TOL[dtype]
    buf = rnd(M, 3 * Kd, dtype=dtype)
    a, b = buf[:, :Kd], buf[:, 2 * Kd :]
    nw, act = rnd(Kd, dtype=dtype), Activation("situ", 4.0, 25.0)
    pro_a = Prologue("rms", x, lambda: NK.rms_norm(x, nw, 1e-6), weight=nw, eps=1e-6)
    pro_b = Prologue("act", a, lambda: MK.activate(act, a, b), other=b, act=act)
    yp, ypair = K.linear(x, w, None, pro_a), K.linear_pair(x, w, pro_a, a, w, pro_b)
    for m in range(M):
        one = slice(m, m + 1)
        assert torch.equal(y[m], K.linear(x[one], w)[0])
        pa = Prologue("rms", x[one], lambda: None, weight=nw, eps=1e-6)
        pb = Prologue("act", a[one], lambda: None, other=b[one], act=act)
        assert torch.equal(yp[m], K.linear(x[one], w, None, pa)[0])
        assert torch.equal(ypair[m], K.linear_pair(x[one], w, pa, a[one], w, pb)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("whole_tile", [True, False])
@pytest.mark.parametrize("small_tile", [0, 4096])
def test_linear_gemv(dtype, M, whole_tile, small_tile, monkeypatch):
    from kestrel.ops.linear import triton as K
    if not whole_tile:  # the K-streaming path
        monkeypatch.setattr(K, "PREFETCH_MAX", 0)
    monkeypatch.setattr(K, "SMALL_TILE", small_tile)
    N, Kd = (40, 96) if SMALL else (3000, 2048)
    x, w = rnd(M, Kd, dtype=dtype), rnd(N, Kd, dtype=dtype, scale=Kd**-0.5)
    assert rel(K.linear(x, w), torch.nn.functional.linear(x.float(), w.float())) < TOL[dtype]
    # batch invariance: each row as a one-row launch computes it, whether the rows share programs or (a small
    # weight) each has its own
    small = w[: max(8, 1024 // Kd)].contiguous()
    # a small weight of many short rows (an LM head's shape: wider tiles under SMALL_TILE)
    heads = rnd(*((1024, 32) if SMALL else (4096, 256)), dtype=dtype, scale=0.1)
    xs = rnd(M, heads.shape[1], dtype=dtype)
    assert K._tile(*heads.shape)[0] == (4 if not small_tile else 8 if SMALL else 16)
    assert rel(K.linear(xs, heads), torch.nn.functional.linear(xs.float(), heads.float())) < TOL[dtype]
    for m in range(M):
        assert torch.equal(K.linear(xs, heads)[m], K.linear(xs[m : m + 1], heads)[0])
    for weight in (w, small):
        y = K.linear(x, weight)
        for m in range(M):
            assert torch.equal(y[m], K.linear(x[m : m + 1], weight)[0])
    # the residual epilogue rounds as the separate add would: bit-equal to GEMV-then-add
    r = rnd(M, N, dtype=dtype)
    y, ya = K.linear(x, w), K.linear(x, w, r)
    if INTERPRET and dtype == torch.bfloat16:  # the interpreter truncates instead of rounding to bf16
        assert rel(ya, y + r) < TOL[dtype]
    else:
        assert torch.equal(ya, y + r)
