import pytest
import torch
import torch.nn.functional as F

from kestrel.ops import host_ints
from kestrel.ops.attn_res.reference import attn_res
from kestrel.ops.mxfp4 import reference as mx
from kestrel.ops.norm.reference import gated_rms_norm, rms_norm
from tests.conftest import argmax_edge_rows

D64 = torch.float64


@pytest.mark.parametrize("T,D", [(5, 8), (600, 128)])  # the stacked form, and the per-value one (>= 64K elements)
def test_attn_res_is_softmax_over_normalised_keys(T, D):
    vals = [torch.randn(T, D, dtype=D64) * (i + 1) for i in range(3)]
    w = torch.randn(D, dtype=D64)
    before = [v.clone() for v in vals]
    out = attn_res(vals, w, 1e-5)
    assert all(torch.equal(v, b) for v, b in zip(vals, before))  # no in-place accumulation into an input
    for t in range(0, T, max(1, T // 7)):
        keys = torch.stack([v[t] / torch.sqrt(v[t].pow(2).mean() + 1e-5) for v in vals])
        p = torch.softmax(keys @ w, 0)
        assert torch.allclose(out[t], sum(p[i] * vals[i][t] for i in range(3)))
    # w = 0: a plain average
    assert torch.allclose(attn_res(vals, torch.zeros(D, dtype=D64), 1e-5), sum(vals) / 3)


@pytest.mark.parametrize("dtype", [torch.float32, D64])
def test_rms_norm_through_torch_is_the_formula_bit_for_bit(dtype):
    """On the CPU, fp32 / fp64 RMSNorm goes through F.rms_norm (one op): it must equal the written formula exactly,
    for any width and row count, with and without a weight (a torch upgrade that changes its rounding fails here)."""
    from kestrel.ops.norm.reference import fused_ok
    from kestrel.spec.drafter import rms

    gen = torch.Generator().manual_seed(0)
    for D in (8, 63, 192, 256, 1000):
        for T in (1, 3, 64, 517):
            x = torch.randn(T, D, dtype=dtype, generator=gen) * torch.rand(T, 1, dtype=dtype, generator=gen) * 10
            w = torch.randn(D, dtype=dtype, generator=gen)
            assert fused_ok(x, w) and fused_ok(x, None)
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            assert torch.equal(rms_norm(x, w, 1e-6), w * y) and torch.equal(rms_norm(x, None, 1e-6), y)
            if dtype == torch.float32:
                assert torch.equal(rms(x, 1e-6, w), y * w)
    assert not fused_ok(torch.zeros(2, 4, dtype=torch.bfloat16), None)
    assert not fused_ok(torch.zeros(2, 4), torch.zeros(4, dtype=D64))
    assert not fused_ok(torch.zeros(2, 3, 4), torch.zeros(3, 4))  # a per-row weight broadcast over the rows


def test_norms():
    x, w, g = torch.randn(4, 8, dtype=D64), torch.randn(8, dtype=D64), torch.randn(4, 8, dtype=D64)
    r = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(rms_norm(x, w, 1e-6), w * r)
    assert torch.allclose(rms_norm(x, None, 1e-6), r)
    assert torch.allclose(gated_rms_norm(x, g, w, 1e-6), w * r * torch.sigmoid(g))


def test_mxfp4_value_table_round_trips_exactly():
    table = mx.e2m1_table(D64)
    assert table[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6] and table[8:].tolist() == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    for exp in (-3, 0, 5):
        w = (table.repeat(4) * 2.0**exp).view(2, 32).float()
        w[:, 0] = 6 * 2.0**exp  # make every block's max the same so the scale is 2^exp
        packed, scales = mx.quantize(w)
        assert (scales.int() == 127 + exp).all()
        assert torch.equal(mx.dequantize(packed, scales), w)


def test_mxfp4_nibble_order_and_rounding():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 1.0, -6.0
    packed, scales = mx.quantize(w)
    # even column in the low nibble: 1.0 is index 2, -6.0 is sign | 7
    assert packed[0, 0].item() == (2 | (0xF << 4)) and scales[0, 0].item() == 127
    w = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 6.0] + [0.0] * 23])
    got = mx.dequantize(*mx.quantize(w))[0, :9].tolist()
    # ties to even mantissa; beyond 6 saturates
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0]


def test_mxfp4_error_bound_and_layouts():
    torch.manual_seed(0)
    w = torch.randn(16, 128)
    packed, scales = mx.quantize(w)
    deq = mx.dequantize(packed, scales)
    blocks = w.view(16, 4, 32)
    # OCP scaling puts a block's max in [4, 8) * scale: at most half the top spacing (2 * scale) of error below 6,
    # and up to 2 * scale where values between 6 and 8 saturate
    scale = torch.exp2(scales.float() - 127).unsqueeze(-1)
    err = (deq.view(16, 4, 32) - blocks).abs()
    assert (err <= 2 * scale + 1e-7).all()
    assert (err[blocks.abs() <= 6 * scale] <= (scale + 1e-7).expand_as(err)[blocks.abs() <= 6 * scale]).all()
    gb, gs = mx.to_gpt_oss(packed, scales)
    assert gb.shape == (16, 4, 16)
    assert torch.equal(mx.dequantize(*mx.from_gpt_oss(gb, gs)), deq)


def test_cpu_linear_fast_path_is_the_reference():
    """On the CPU, same-dtype linears skip the dispatch and casts: the result must be the reference's exactly, with
    and without the residual `add`; mixed dtypes still promote as the reference does."""
    from kestrel.ops import linear as linear_ops
    from kestrel.ops.linear import reference as linear_ref

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, D64, torch.bfloat16):
        x, w = torch.randn(3, 5, 16, generator=gen).to(dtype), torch.randn(24, 16, generator=gen).to(dtype)
        add = torch.randn(3, 5, 24, generator=gen).to(dtype)
        assert torch.equal(linear_ops.linear(x, w), linear_ref.linear(x, w))
        assert torch.equal(linear_ops.linear(x, w, add), linear_ref.linear(x, w, add))
    x, w = torch.randn(2, 16, generator=gen).to(torch.bfloat16), torch.randn(8, 16, generator=gen)
    assert linear_ops.linear(x, w).dtype == torch.float32
    assert torch.equal(linear_ops.linear(x, w), linear_ref.linear(x, w))


def test_kmajor_gemv_is_the_product_and_follows_the_weight():
    """A large weight's one-row CPU product through its K-major copy: the product (up to the GEMV's summation
    order) for fresh random inputs, through the Linear layer (with a residual) and directly; the copy is renewed
    when the weight changes in place or is replaced, and not used for several rows, small weights or autograd."""
    from kestrel.models.layers.linear import Linear
    from kestrel.ops import linear as linear_ops

    gen = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ())))
    lin = Linear(256, 1024)  # 1 MiB of fp32: the smallest weight it serves
    with torch.no_grad():
        lin.weight.copy_(torch.randn(1024, 256, generator=gen))
    x, add = torch.randn(1, 256, generator=gen), torch.randn(1, 1024, generator=gen)
    K = linear_ops.KMajorGemv
    assert K.serves(x, lin.weight.detach()) and not K.serves(torch.randn(2, 256), lin.weight.detach())
    assert not K.serves(x, torch.randn(512, 256)) and not K.serves(x.double(), lin.weight.detach())
    assert not K.serves(x, lin.weight)  # grad mode and a trainable weight: autograd's F.linear
    with torch.no_grad():
        torch.testing.assert_close(lin(x, add), F.linear(x, lin.weight) + add, rtol=1e-5, atol=1e-5)
        copy = lin._kmajor._copy
        lin.weight.mul_(-1)  # in place: the old copy would give the negated product
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
        assert lin._kmajor._copy is not copy
        lin.weight = torch.nn.Parameter(torch.randn(1024, 256, generator=gen))  # replaced
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_is_torch_argmax_with_ties_nans_and_infinities(dtype):
    from kestrel.ops import argmax

    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ())))
    x = argmax_edge_rows(dtype)
    with torch.inference_mode():
        cases = [x, x[:, ::3], x.t().contiguous().t(), x[4], x[:1]]
        for c in cases:
            got = argmax(c)
            assert got.dtype == torch.long and got.shape == c.shape[:-1]
            assert torch.equal(got, c.argmax(-1))
    # and on the fast path, fresh random rows
    y = torch.randn(64, 4096, generator=g, dtype=dtype)
    assert torch.equal(argmax(y), y.argmax(-1))


def test_host_ints_equals_torch_tensor():
    cases = (([3, -1, 7], torch.long), ([5, 0], torch.int32), ([True, False, True], torch.bool), ([], torch.long))
    for values, dtype in cases:
        t = host_ints(values, "cpu", dtype)
        assert t.dtype == dtype and torch.equal(t, torch.tensor(values, dtype=dtype))
