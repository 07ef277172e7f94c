import math

import pytest
import torch

from kestrel.engine.sampler import SamplingState, sample
from kestrel.engine.sampling_params import InvalidRequest, SamplingParams
from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.presets import init_random, preset_config
from tests.engine.helpers import drive, make_core


def draw(logits: torch.Tensor, params: dict, n: int) -> torch.Tensor:
    p = SamplingParams.from_dict(params)
    states = [SamplingState(p, seed, []) for seed in range(n)]
    return sample(logits.expand(n, -1).clone(), states, False, 0).tokens


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> bool:
    keep = probs * n >= 5
    expected = probs[keep] * n
    stat = ((counts[keep] - expected) ** 2 / expected).sum().item()
    dof = int(keep.sum()) - 1
    # mean dof, sd sqrt(2 dof): 5 sd is a loose bound that a wrong sampler still fails by a mile
    return stat < dof + 5 * math.sqrt(2 * dof)


def test_temperature_sampling_matches_the_distribution():
    logits = torch.randn(12, generator=torch.Generator().manual_seed(0)) * 2
    n = 6000
    tokens = draw(logits, {"temperature": 0.7}, n)
    counts = torch.bincount(tokens, minlength=12).double()
    assert chi_square_ok(counts, torch.softmax(logits.double() / 0.7, -1), n)


def test_top_k_top_p_min_p_truncate():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    assert set(draw(logits, {"top_k": 2}, 400).tolist()) == {0, 1}
    # top_p 0.6: 0.4 alone is below the line, 0.4 + 0.3 crosses it
    assert set(draw(logits, {"top_p": 0.6}, 400).tolist()) == {0, 1}
    assert set(draw(logits, {"min_p": 0.3}, 400).tolist()) == {0, 1, 2}
    tokens = draw(logits, {"top_k": 3}, 6000)
    probs = torch.tensor([0.4, 0.3, 0.15, 0.0, 0.0], dtype=torch.float64) / 0.85
    assert chi_square_ok(torch.bincount(tokens, minlength=5).double(), probs, 6000)


def greedy_with(logits, params: dict, prompt=(), counts=None) -> int:
    st = SamplingState(SamplingParams.from_dict({"temperature": 0, **params}), 0, list(prompt))
    st.counts = dict(counts or {})
    return sample(torch.tensor([logits], dtype=torch.float64), [st], False, 0).tokens.item()


def test_penalties_follow_their_definitions():
    logits = [2.0, 1.0, -1.0, 0.5]
    assert greedy_with(logits, {}) == 0
    assert greedy_with([2.0, 1.2, -1.0], {"repetition_penalty": 2.0}, prompt=[0]) == 1  # 2.0 / 2.0 = 1.0 < 1.2
    assert greedy_with(logits, {"repetition_penalty": 1.5}, prompt=[0]) == 0  # 2.0 / 1.5 = 1.33
    assert greedy_with([-1.0, -1.5], {"repetition_penalty": 2.0}, prompt=[0]) == 1  # negatives are multiplied
    assert greedy_with(logits, {"frequency_penalty": 0.6}, counts={0: 2}) == 1  # 2.0 - 1.2
    assert greedy_with(logits, {"frequency_penalty": 0.6}, counts={0: 1}) == 0  # 2.0 - 0.6
    assert greedy_with(logits, {"presence_penalty": 1.5}, counts={0: 1}) == 1  # 2.0 - 1.5


def test_min_new_tokens_holds_back_stop_ids():
    logits = torch.tensor([[5.0, 0.0, 1.0]])
    p = SamplingParams.from_dict({"temperature": 0, "min_new_tokens": 2})
    st = SamplingState(p, 0, [], stop_ids=frozenset({0}))
    assert [sample(logits.clone(), [st], False, 0).tokens.item() for _ in range(3)] == [2, 2, 0]


@pytest.fixture(scope="module")
def tiny32():
    m = K3ForCausalLM(preset_config("k3-tiny"))
    init_random(m, seed=0)
    return m.eval()


def test_seeded_sampling_is_batch_invariant(tiny32):
    prompt = list(range(10, 40))
    params = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": 1234, "ignore_eos": True}
    core = make_core(tiny32, disable_radix_cache=True)
    core.model = tiny32
    alone = drive(core, [core.make_request(prompt, params)])
    alone_ids = next(iter(alone.values())).output_ids
    others = [core.make_request(list(range(i, i + 5 + 3 * i)), {**params, "seed": i}) for i in range(15)]
    target = core.make_request(prompt, params)
    done = drive(core, others[:7] + [target] + others[7:], seed=3)
    assert done[target.rid].output_ids == alone_ids
    # different seeds do differ (the test can fail)
    assert len({tuple(done[r.rid].output_ids) for r in others}) > 10
    core.shutdown()


@pytest.mark.parametrize("bad,pattern", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"bogus_key": 1}, "bogus_key"),
    ({"stop_token_ids": [99999]}, "99999"),
])
def test_bad_sampling_params_name_the_value(tiny64, bad, pattern):
    core = make_core(tiny64, disable_radix_cache=True)
    with pytest.raises(InvalidRequest, match=pattern):
        core.make_request([1, 2, 3], bad)


def test_sampling_leaves_tokens_on_the_device_unless_penalties_count_them(monkeypatch):
    """`sample` reads its tokens back only when a penalty must count them: otherwise the states only step on, so
    the overlap scheduler's next batch can launch before this one's tokens reach the host."""
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    logits = torch.randn(3, 50, dtype=torch.float64)
    plain = [SamplingState(SamplingParams(temperature=t, seed=1), 1, []) for t in (0.0, 0.7, 1.0)]
    out = sample(logits.clone(), plain, False, 0)
    assert reads == [] and [st.step for st in plain] == [1, 1, 1]
    penalised = [SamplingState(SamplingParams(temperature=0.0, presence_penalty=0.5), 1, [])] + plain[1:]
    out2 = sample(logits.clone(), penalised, False, 0)
    assert reads and penalised[0].counts == {int(out2.tokens[0]): 1}
    assert int(out.tokens[0]) == int(logits[0].argmax())
