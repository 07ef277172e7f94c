import random

import pytest

from kestrel.train import arith


def test_heldout_split_never_reaches_training():
    rng = random.Random(0)
    train = [arith.sample(rng, "train") for _ in range(20_000)]
    heldout = arith.heldout_problems(1000, seed=0)
    assert not any(arith.is_heldout(p.question) for p in train)
    assert all(arith.is_heldout(p.question) for p in heldout)
    assert not {p.question for p in train} & {p.question for p in heldout}
    # other seeds draw other held-out problems, still from the held-out side
    other = arith.heldout_problems(200, seed=1)
    assert all(arith.is_heldout(p.question) for p in other)
    assert {p.question for p in other} != {p.question for p in heldout[:200]}


def test_heldout_fraction_and_kind_mix():
    rng = random.Random(1)
    draws = [arith.random_problem(rng) for _ in range(20_000)]
    share = sum(arith.is_heldout(p.question) for p in draws) / len(draws)
    assert abs(share - arith.HELDOUT_PERCENT / 100) < 0.01
    kinds = {k: sum(p.kind == k for p in draws) / len(draws) for k in arith.KIND_WEIGHTS}
    for k, w in arith.KIND_WEIGHTS.items():
        assert abs(kinds[k] - w) < 0.02, (k, kinds[k])


def test_heldout_problems_deterministic_and_distinct():
    a, b = arith.heldout_problems(300, seed=7), arith.heldout_problems(300, seed=7)
    assert a == b
    assert len({p.question for p in a}) == 300


@pytest.mark.parametrize("kind", list(arith.KIND_WEIGHTS))
def test_worked_solutions_are_right(kind):
    rng = random.Random(kind)
    for _ in range(2000):
        p = arith.random_problem(rng, kind)
        # canonical questions are Python expressions: Python checks the arithmetic
        assert p.answer == str(eval(p.question)), p
        assert arith.answer_of(p.document) == p.answer
        assert p.document.startswith(p.prompt) and p.prompt.endswith("?\n")
        assert not any(line.startswith("Answer:") for line in p.steps)
        if kind != "expr":
            # the column work ends with the answer's digits written so far (leading zeros aside)
            so_far = p.steps[-1].rsplit("so far ", 1)[1]
            assert (so_far.lstrip("0") or "0") == p.answer.lstrip("-")


def test_column_addition_format():
    p = arith.add_problem(385, 47)
    assert p.document == ("Question: What is 385 + 47?\n"
                          "ones: 5+7+0=12, carry 1, so far 2\n"
                          "tens: 8+4+1=13, carry 1, so far 32\n"
                          "hundreds: 3+0+1=4, carry 0, so far 432\n"
                          "Answer: 432")
    assert arith.sub_problem(47, 385).steps[0] == "47 < 385, so 47 - 385 = -(385 - 47)"
    assert arith.sub_problem(47, 385).answer == "-338"
    assert arith.sub_problem(402, 187).steps[0] == "ones: 2-7-0=-5, +10=5, borrow 1, so far 5"
    assert arith.mul_problem(47, 8).steps[-1] == "hundreds: carry 3, so far 376"


def test_answer_of():
    assert arith.answer_of("ones: 1+1+0=2, carry 0, so far 2\nAnswer: 2") == "2"
    assert arith.answer_of("x\nAnswer: -17\nQuestion: What is 1 + 1?\nAnswer: 2\n") == "-17"
    assert arith.answer_of("Answer: 12 \n") == "12"
    assert arith.answer_of("no answer here") is None
    assert arith.answer_of("Answer: 12abc") is None
    assert arith.answer_of("the Answer: 12") is None
    assert arith.answer_of("Answer: ") is None
    assert not arith.answer_complete("Answer: 12")
    assert arith.answer_complete("Answer: 12\n")


def test_chat_variant():
    p = arith.add_problem(12, 30)
    messages = p.chat_messages(random.Random(0))
    assert messages[-1] == {"role": "assistant", "content": p.solution}
    assert p.question in messages[-2]["content"] and messages[-2]["role"] == "user"


def test_unknown_split_and_kind_are_named():
    with pytest.raises(ValueError, match="'test'"):
        arith.sample(random.Random(0), "test")
    with pytest.raises(ValueError, match="'div'"):
        arith.random_problem(random.Random(0), "div")
