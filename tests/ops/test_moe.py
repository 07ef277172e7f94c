import pytest
import torch

from kestrel.ops.moe import reference as ref

D64 = torch.float64


def test_situ_formula():
    a, b = torch.randn(100, dtype=D64) * 20, torch.randn(100, dtype=D64) * 60
    want = 4 * torch.tanh(a / 4) * torch.sigmoid(a) * 25 * torch.tanh(b / 25)
    assert torch.allclose(ref.situ(a, b), want)
    # soft clipping: bounded by 4 * 25 whatever the inputs
    assert ref.situ(torch.tensor([1e6]), torch.tensor([1e6])).item() <= 100.0 + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_situ_in_place_equals_the_expression_and_keeps_gradients(dtype):
    """The in-place evaluation rounds exactly as the written-out expression; with gradients it takes the expression
    (in-place ops would overwrite what autograd saved)."""
    a, b = (torch.randn(300, 24) * 4).to(dtype), (torch.randn(300, 24) * 40).to(dtype)
    af, bf = a.float(), b.float()
    clip = lambda x, c: torch.sigmoid(x * (2.0 / c)) * (2.0 * c) - c  # noqa: E731  (c tanh(x / c))
    want = (clip(af, 4.0) * torch.sigmoid(af) * clip(bf, 25.0)).to(dtype)
    assert torch.equal(ref.situ(a, b), want)
    # and within fp32 rounding of the tanh form (outputs up to 100: absolute error ~1e-5)
    tanh_form = (4.0 * torch.tanh(af / 4.0) * torch.sigmoid(af) * (25.0 * torch.tanh(bf / 25.0))).to(dtype)
    assert torch.allclose(ref.situ(a, b).float(), tanh_form.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                          atol=0.5 if dtype == torch.bfloat16 else 1e-4)
    ag, bg = af.clone().requires_grad_(), bf.clone().requires_grad_()
    ref.situ(ag, bg).sum().backward()
    assert torch.isfinite(ag.grad).all() and ag.grad.abs().sum() > 0 and bg.grad.abs().sum() > 0


def test_route_bias_chooses_scores_weight():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=D64)
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0], dtype=D64)
    w, ids = ref.route(logits, bias, top_k=2, renormalize=True, scaling=2.0)
    assert sorted(ids[0].tolist()) == [0, 3]  # expert 0 is chosen through the bias...
    s = torch.sigmoid(logits[0, [0, 3]])
    got = dict(zip(ids[0].tolist(), w[0].tolist()))
    # ...but weighted by its unbiased score, renormalised, scaled
    assert abs(got[0] - 2.0 * s[0] / s.sum()) < 1e-12 and abs(got[3] - 2.0 * s[1] / s.sum()) < 1e-12


def test_route_top1_skips_renormalisation():
    logits = torch.tensor([[0.5, -1.0]], dtype=D64)
    w, ids = ref.route(logits, None, top_k=1, renormalize=True, scaling=1.5)
    assert ids.item() == 0 and abs(w.item() - 1.5 * torch.sigmoid(torch.tensor(0.5, dtype=D64)).item()) < 1e-12


def test_group_limited_routing_only_when_more_groups_than_chosen():
    torch.manual_seed(0)
    logits = torch.randn(50, 8, dtype=D64)
    a = ref.route(logits, None, 2, True, 1.0, num_expert_group=2, topk_group=2)
    b = ref.route(logits, None, 2, True, 1.0)
    assert torch.equal(a[1].sort(-1).values, b[1].sort(-1).values)
    # 4 groups of 2, keep 1 group: both experts come from one group
    w, ids = ref.route(logits, None, 2, True, 1.0, num_expert_group=4, topk_group=1)
    assert ((ids // 2)[:, 0] == (ids // 2)[:, 1]).all()


def test_experts_loop_equals_dense_per_token():
    torch.manual_seed(1)
    T, D, I, E, k = 7, 6, 5, 4, 2
    x = torch.randn(T, D, dtype=D64)
    w1, w3, w2 = torch.randn(E, I, D, dtype=D64), torch.randn(E, I, D, dtype=D64), torch.randn(E, D, I, dtype=D64)
    weights, ids = ref.route(torch.randn(T, E, dtype=D64), None, k, True, 1.0)
    act = ref.Activation("situ")
    out = ref.moe_experts(x, w1, w2, w3, weights, ids, act)
    for t in range(T):
        want = sum(weights[t, j] * (w2[e] @ act(w1[e] @ x[t], w3[e] @ x[t])) for j, e in enumerate(ids[t].tolist()))
        assert torch.allclose(out[t], want)


def test_dense_expert_form_equals_the_loop():
    torch.manual_seed(2)
    T, D, I, E = 9, 6, 5, 4
    x = torch.randn(T, D, dtype=D64)
    w1, w3, w2 = torch.randn(E, I, D, dtype=D64), torch.randn(E, I, D, dtype=D64), torch.randn(E, D, I, dtype=D64)
    weights, ids = ref.route(torch.randn(T, E, dtype=D64), None, 2, True, 1.3)
    act = ref.Activation("situ")
    assert torch.allclose(ref.moe_experts_dense(x, w1, w2, w3, weights, ids, act),
                          ref.moe_experts(x, w1, w2, w3, weights, ids, act))


@pytest.mark.parametrize("T", [1, 5, 40])
@pytest.mark.parametrize("dtype", [torch.float32, D64])
def test_grouped_expert_form_equals_the_loop(T, dtype):
    """The expert-sorted CPU form: same pairs, same per-token order of the sums, so equal to the loop up to the
    matrix products' own rounding (an expert no token chose, or one chosen by every token, included)."""
    torch.manual_seed(T)
    D, I, E = 12, 10, 6
    x = torch.randn(T, D, dtype=dtype)
    w1, w3, w2 = torch.randn(E, I, D, dtype=dtype), torch.randn(E, I, D, dtype=dtype), torch.randn(E, D, I, dtype=dtype)
    logits = torch.randn(T, E, dtype=dtype)
    logits[:, 0] -= 100  # expert 0 never chosen
    logits[:, 3] += 100  # expert 3 always chosen
    weights, ids = ref.route(logits, None, 2, True, 1.3)
    act = ref.Activation("situ")
    got = ref.moe_experts_grouped(x, w1, w2, w3, weights, ids, act)
    want = ref.moe_experts(x, w1, w2, w3, weights, ids, act)
    tol = 1e-12 if dtype == D64 else 1e-5
    assert (got - want).abs().max() <= tol * want.abs().max()


@pytest.mark.parametrize("T", [1, 5, 40])
@pytest.mark.parametrize("dtype", [torch.float32, D64])
def test_padded_expert_form_equals_the_grouped_one(T, dtype):
    """The padded batched CPU form: the grouped form's sums up to the products' rounding, with an expert no
    token chose and one every token chose; a routing too skewed for its padding is declined (None)."""
    torch.manual_seed(100 + T)
    D, I, E = 12, 10, 6
    x = torch.randn(T, D, dtype=dtype)
    w1, w3, w2 = torch.randn(E, I, D, dtype=dtype), torch.randn(E, I, D, dtype=dtype), torch.randn(E, D, I, dtype=dtype)
    logits = torch.randn(T, E, dtype=dtype)
    logits[:, 0] -= 100
    logits[:, 3] += 100
    weights, ids = ref.route(logits, None, 2, True, 1.3)
    act = ref.Activation("situ")
    want = ref.moe_experts_grouped(x, w1, w2, w3, weights, ids, act)
    got = ref.moe_experts_padded(x, w1, w2, w3, weights, ids, act, max_waste=E)
    tol = 1e-12 if dtype == D64 else 1e-5
    assert (got - want).abs().max() <= tol * want.abs().max()
    # every token on experts 3 and 1: two busy blocks of T rows, four empty ones: 6T padded rows for 2T pairs
    ids = torch.tensor([[3, 1]] * T)
    assert ref.moe_experts_padded(x, w1, w2, w3, weights, ids, act, max_waste=2.0) is None
    assert ref.moe_experts_padded(x, w1, w2, w3, weights, ids, act, max_waste=3.0) is not None
