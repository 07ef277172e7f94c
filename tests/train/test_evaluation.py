import argparse
import json
import math

import pytest
import torch

from kestrel import evaluation
from kestrel.models.loader import load_model, save_checkpoint
from kestrel.tokenizer import Tokenizer
from kestrel.train import arith, trainer


def test_wilson_interval():
    # tabulated values (Newcombe 1998): 5/10 -> 0.2366..0.7634, 0/10 -> 0..z^2 / (n + z^2)
    assert evaluation.wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert evaluation.wilson_interval(0, 10) == pytest.approx((0.0, 1.96**2 / (10 + 1.96**2)), abs=1e-12)
    # the interval is where the score test just accepts: |k/n - x| = z sqrt(x (1 - x) / n) at both ends
    for k, n in ((81, 263), (1, 200), (120, 200), (199, 200)):
        for x in evaluation.wilson_interval(k, n):
            assert abs(k / n - x) == pytest.approx(1.96 * math.sqrt(x * (1 - x) / n), rel=1e-9)
    lo, hi = evaluation.wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.2775, abs=1e-4)
    with pytest.raises(ValueError, match="passed=3, n=2"):
        evaluation.wilson_interval(3, 2)


def test_pass_rate_scores_exact_answers():
    problems = {p.prompt: p for p in arith.heldout_problems(40, seed=3)}
    solve = lambda prompts, _: [problems[p].solution + "\nQuestion: junk\nAnswer: 0" for p in prompts]  # noqa: E731
    half = lambda prompts, _: [problems[p].solution if i % 2 else "Answer: x"  # noqa: E731
                               for i, p in enumerate(prompts)]
    assert evaluation.arith_pass_rate(solve, n=40, seed=3).rate == 1.0
    result = evaluation.arith_pass_rate(half, n=40, seed=3)
    assert result.passed == 20 and result.ci95 == evaluation.wilson_interval(20, 40)
    assert sum(n for _, n in result.by_kind.values()) == 40
    off_by_one = lambda prompts, _: [f"Answer: {int(problems[p].answer) + 1}" for p in prompts]  # noqa: E731
    assert evaluation.arith_pass_rate(off_by_one, n=40, seed=3).passed == 0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tokenizer_dir):
    model = trainer.build_model(trainer.TrainArgs(preset="k3-tiny"))
    path = tmp_path_factory.mktemp("tiny")
    save_checkpoint(model, path, tokenizer_dir=tokenizer_dir, dtype=torch.bfloat16)
    return path


def test_eval_runs_on_a_random_tiny_model(tiny_checkpoint, tmp_path):
    parser = argparse.ArgumentParser()
    evaluation.add_eval_args(parser)
    out = tmp_path / "eval.json"
    ns = parser.parse_args(["--model", str(tiny_checkpoint), "--device", "cpu", "--n", "2", "--max-new-tokens", "6",
                            "--window", "64", "--code-windows", "4", "--json", str(out)])
    results = evaluation.run_eval(ns)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    a, c = results["arith"], results["code"]
    assert a["n"] == 2 and 0 <= a["rate"] <= 1 and a["ci95"][0] <= a["rate"] <= a["ci95"][1]
    assert all(len(e["completion"]) > 0 for e in a["examples"])
    # small random init: next-token predictions are close to uniform over the 4096 tokens
    assert c["tokens"] == 4 * 64 and 0.9 * math.log(4096) < c["nll"] < 1.1 * math.log(4096)


def test_run_eval_uses_the_given_generate_fn(tiny_checkpoint):
    problems = {p.prompt: p for p in arith.heldout_problems(10, seed=4)}
    calls = []

    def engine(prompts, max_new_tokens):
        calls.append((len(prompts), max_new_tokens))
        return [problems[p].solution for p in prompts]

    parser = argparse.ArgumentParser()
    evaluation.add_eval_args(parser)
    ns = parser.parse_args(["--model", str(tiny_checkpoint), "--n", "10", "--seed", "4", "--skip-code",
                            "--max-new-tokens", "100"])
    results = evaluation.run_eval(ns, generate_fn=engine)
    assert results["arith"]["rate"] == 1.0 and calls == [(10, 100)] and "code" not in results


def test_greedy_fallback_respects_the_limit_and_stops(tiny_checkpoint):
    model, tok = load_model(tiny_checkpoint, progress=False), Tokenizer(tiny_checkpoint)
    (text,) = evaluation.greedy_generate_fn(model, tok)(["Question: What is 1 + 2?\n"], 5)
    assert isinstance(text, str) and text

    class Scripted:
        """Emits a fixed continuation, whatever the prompt."""

        cfg = model.cfg

        def __init__(self, text: str, prompt_len: int):
            self.script, self.prompt_len = tok.encode(text, add_special_tokens=False), prompt_len

        def reference_logits(self, ids):
            nxt = self.script[len(ids) - self.prompt_len]
            return torch.nn.functional.one_hot(torch.tensor([nxt] * len(ids)), 4096).float()

    prompt_len = len(tok.encode("x"))
    long = Scripted("def f(x):\n    return x + 1\n", prompt_len)
    assert evaluation.greedy_generate_fn(long, tok)(["x"], 4) == [tok.decode(long.script[:4])]
    generate = evaluation.greedy_generate_fn(Scripted("ones: 1\nAnswer: 3\nQuestion: more", prompt_len), tok)
    assert generate(["x"], 50) == ["ones: 1\nAnswer: 3\n"]
    generate = evaluation.greedy_generate_fn(Scripted("so far 2<|im_end|>Answer: 3\n", prompt_len), tok)
    assert generate(["x"], 50) == ["so far 2"]


def test_missing_model_is_named(tmp_path):
    parser = argparse.ArgumentParser()
    evaluation.add_eval_args(parser)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        evaluation.run_eval(parser.parse_args(["--model", str(tmp_path / "nowhere")]))
