"""`kestrel eval`: the held-out arithmetic pass rate (the reward signal RL improves) and held-out code perplexity.

Arithmetic: N problems from the held-out split of kestrel.train.arith, each prompted in the training format
(`Question: What is 385 + 47?\\n`), decoded greedily by a `generate_fn(prompts, max_new_tokens) -> completions`
(the serving engine, or the slow reference loop here), scored by exact match of the `Answer: N` line, reported with
a Wilson 95% interval. Code: teacher-forced perplexity over fixed-length windows of the held-out stdlib files
(which files those are depends on the Python version running this: compare numbers from the same version).
"""

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.loader import load_model
from kestrel.tokenizer import Tokenizer
from kestrel.train import arith, corpus
from kestrel.train.trainer import add_dataclass_args, resolve_device

GenerateFn = Callable[[list[str], int], list[str]]
DEFAULT_MODEL = Path(__file__).parent / "assets" / "k3-small"
# the longest worked solution (two-digit by two-digit multiplication) is ~230 tokens
DEFAULT_MAX_NEW_TOKENS = 400


def wilson_interval(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion passed / n."""
    if n <= 0 or not 0 <= passed <= n:
        raise ValueError(f"wilson_interval needs 0 <= passed <= n and n > 0, got passed={passed}, n={n}")
    p = passed / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


@dataclass(frozen=True)
class ArithResult:
    n: int
    passed: int
    rate: float
    ci95: tuple[float, float]
    by_kind: dict[str, tuple[int, int]]  # kind -> (passed, n)
    examples: list[dict] = field(default_factory=list)  # the first few (question, expected, got, completion)


@dataclass(frozen=True)
class CodeResult:
    files: int
    tokens: int  # predicted tokens
    nll: float  # mean negative log-likelihood per token (nats)
    perplexity: float


def arith_pass_rate(generate_fn: GenerateFn, n: int = 200, seed: int = 0,
                    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, keep_examples: int = 5) -> ArithResult:
    problems = arith.heldout_problems(n, seed)
    completions = generate_fn([p.prompt for p in problems], max_new_tokens)
    if len(completions) != len(problems):
        raise ValueError(f"generate_fn returned {len(completions)} completions for {len(problems)} prompts")
    by_kind: dict[str, list[int]] = {}
    passed, examples = 0, []
    for p, text in zip(problems, completions):
        got = arith.answer_of(text)
        ok = got == p.answer
        passed += ok
        tally = by_kind.setdefault(p.kind, [0, 0])
        tally[0] += ok
        tally[1] += 1
        if len(examples) < keep_examples:
            examples.append({"question": p.question, "expected": p.answer, "got": got, "completion": text})
    return ArithResult(n=n, passed=passed, rate=passed / n, ci95=wilson_interval(passed, n),
                       by_kind={k: tuple(v) for k, v in sorted(by_kind.items())}, examples=examples)


@torch.no_grad()
def code_perplexity(model: K3ForCausalLM, tokenizer: Tokenizer, window: int = 512, max_windows: int = 64,
                    batch_size: int = 8, files: list[tuple[str, str]] | None = None) -> CodeResult:
    """Teacher-forced perplexity on non-overlapping windows of the held-out stdlib files read back to back."""
    files = corpus.stdlib_files("heldout") if files is None else files
    if not files:
        raise ValueError("no held-out code files to measure perplexity on")
    stream = corpus.DocPool.encode(tokenizer.tok, [text for _, text in files]).tokens.astype(np.int64)
    count = min(max_windows, (len(stream) - 1) // window)
    if count < 1:
        raise ValueError(f"the held-out code has {len(stream)} tokens, less than one window of {window}")
    blocks = torch.from_numpy(stream[: count * window + 1])
    device = model.lm_head.weight.device
    total, tokens = 0.0, 0
    for start in range(0, count, batch_size):
        rows = range(start, min(count, start + batch_size))
        batch = torch.stack([blocks[r * window : (r + 1) * window + 1] for r in rows]).to(device)
        logits = model.logits_train(batch[:, :-1]).float()
        total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
        tokens += batch[:, 1:].numel()
    nll = total / tokens
    return CodeResult(files=len(files), tokens=tokens, nll=nll, perplexity=math.exp(nll))


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> K3ForCausalLM:
    """A checkpoint in fp32 for evaluation."""
    return load_model(path, dtype=torch.float32, device=device, progress=False)


def greedy_generate_fn(model: K3ForCausalLM, tokenizer: Tokenizer) -> GenerateFn:
    """The slow, obviously correct generator: the full-forward reference over the whole sequence per token.
    Stops at a stop token of the model or once the answer line is complete."""
    stop = set(model.cfg.eos_token_ids)

    def generate(prompts: list[str], max_new_tokens: int) -> list[str]:
        out = []
        for prompt in prompts:
            ids, new = tokenizer.encode(prompt), []
            for _ in range(max_new_tokens):
                nxt = int(model.reference_logits(ids + new)[-1].argmax())
                if nxt in stop:
                    break
                new.append(nxt)
                if arith.answer_complete(tokenizer.decode(new)):
                    break
            out.append(tokenizer.decode(new))
        return out

    return generate


@dataclass(frozen=True)
class EvalArgs:
    """Every `kestrel eval` flag."""

    model: str = field(default=str(DEFAULT_MODEL), metadata={"help": "checkpoint directory"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N, or auto"})
    n: int = field(default=200, metadata={"help": "held-out arithmetic problems"})
    seed: int = field(default=0, metadata={"help": "which held-out problems"})
    max_new_tokens: int = field(default=DEFAULT_MAX_NEW_TOKENS, metadata={"help": "generation limit per problem"})
    window: int = field(default=512, metadata={"help": "tokens per perplexity window"})
    code_windows: int = field(default=64, metadata={"help": "at most this many perplexity windows"})
    skip_arith: bool = field(default=False, metadata={"help": "skip the arithmetic pass rate"})
    skip_code: bool = field(default=False, metadata={"help": "skip the code perplexity"})
    json: str | None = field(default=None, metadata={"help": "also write the results to this JSON file"})

    def __post_init__(self):
        for name in ("n", "max_new_tokens", "window", "code_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval flag --{name.replace('_', '-')} = {getattr(self, name)!r} must be >= 1")


def add_eval_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, EvalArgs)


def run_eval(ns: argparse.Namespace, generate_fn: GenerateFn | None = None) -> dict:
    """`kestrel eval`: prints a short table, returns (and with --json writes) the results."""
    args = EvalArgs(**{name: getattr(ns, name) for name in (f.name for f in fields(EvalArgs)) if hasattr(ns, name)})
    path = Path(args.model)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--model {str(path)!r} is not a checkpoint directory (no config.json); "
                                f"train one with `kestrel train`")
    # an engine's generate_fn holds its own copy of the weights: load them here only when something reads them
    needs_model = not args.skip_code or (generate_fn is None and not args.skip_arith)
    model = load_checkpoint(path, resolve_device(args.device)) if needs_model else None
    tokenizer = Tokenizer(path)
    results: dict = {"model": str(path)}
    if not args.skip_arith:
        gen = generate_fn or greedy_generate_fn(model, tokenizer)
        results["arith"] = asdict(arith_pass_rate(gen, args.n, args.seed, args.max_new_tokens))
    if not args.skip_code:
        results["code"] = asdict(code_perplexity(model, tokenizer, args.window, args.code_windows))
    print(format_results(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def run_eval_cli(ns: argparse.Namespace) -> int:
    """`kestrel eval` on the command line: the arithmetic generations go through the serving engine (greedy)."""
    if ns.skip_arith:
        run_eval(ns)
        return 0
    from kestrel.engine.engine import Engine

    with Engine(model=ns.model, device=ns.device) as engine:
        def generate(prompts: list[str], max_new_tokens: int) -> list[str]:
            outs = engine.generate(prompts, {"max_new_tokens": max_new_tokens, "temperature": 0.0})
            return [o["text"] for o in outs]

        run_eval(ns, generate_fn=generate)
    return 0


def format_results(results: dict) -> str:
    lines = []
    if "arith" in results:
        a = results["arith"]
        lo, hi = a["ci95"]
        lines.append(f"held-out arithmetic  {a['n']:>5} problems  pass {a['rate']:6.1%}  "
                     f"(95% CI {lo:.1%} - {hi:.1%})")
        for kind, (ok, n) in a["by_kind"].items():
            lines.append(f"  {kind:<18} {n:>5} problems  pass {ok / n:6.1%}")
    if "code" in results:
        c = results["code"]
        lines.append(f"held-out code        {c['files']:>5} files     perplexity {c['perplexity']:.2f} "
                     f"({c['tokens']:,} tokens, {c['nll']:.3f} nats/token)")
    return "\n".join(lines)
