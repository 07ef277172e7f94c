"""Arithmetic problems with worked, digit-by-digit solutions: training data and the held-out reward set.

Every solution is a few step lines and one final line `Answer: N`. Column arithmetic runs from the ones place up,
one line per place, naming the place, the carry (or borrow) and the digits written so far, so the next line and the
answer are short copies of what the model has just written:

    Question: What is 385 + 47?
    ones: 5+7+0=12, carry 1, so far 2
    tens: 8+4+1=13, carry 1, so far 32
    hundreds: 3+0+1=4, carry 0, so far 432
    Answer: 432

A problem's identity is its canonical question text ("385 + 47"); a stable hash of it puts the problem in the
training or the held-out split, so held-out problems are never trained on, whatever seed draws them.
"""

import hashlib
import random
import re
from dataclasses import dataclass

PLACES = ("ones", "tens", "hundreds", "thousands", "ten-thousands")
# percent of problem identities held out from training
HELDOUT_PERCENT = 5


@dataclass(frozen=True)
class Profile:
    """Which problems are drawn: kind weights and operand ranges."""

    weights: tuple[tuple[str, float], ...]
    mul2_digits: tuple[int, int]  # digits of the first factor of a two-digit multiplication
    expr_small: int  # largest operand that gets multiplied inside an expression
    expr_large: int  # largest other expression operand


# pretraining curriculum: the column procedures k3-small learns almost perfectly, small mental arithmetic
TRAIN = Profile((("add", 0.3), ("sub", 0.25), ("mul", 0.15), ("mul2", 0.15), ("expr", 0.15)), (2, 2), 12, 50)
# the held-out evaluation and RL reward set: the same kinds over wider ranges, weighted to the hard ones
# (expressions worked without column steps up to 20 x 20 and two-digit sums; three-digit by two-digit products),
# where the bundled model is competent but far from perfect, so reward has room to rise
EVAL = Profile((("add", 0.1), ("sub", 0.1), ("mul", 0.05), ("mul2", 0.15), ("expr", 0.6)), (2, 3), 20, 99)
KIND_WEIGHTS = dict(TRAIN.weights)
CHAT_PHRASINGS = ("What is {q}?", "Compute {q}.", "Calculate {q}", "{q} = ?", "Please work out {q}.", "What's {q}?",
                  "Solve {q} step by step.")
SYSTEM_PROMPT = "You are a helpful assistant."
_ANSWER = re.compile(r"^Answer: (-?\d+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    kind: str
    question: str  # canonical text, e.g. "385 + 47": the problem's identity
    steps: tuple[str, ...]
    answer: str

    @property
    def prompt(self) -> str:
        """The plain completion prompt; the model continues with the steps and the answer line."""
        return f"Question: What is {self.question}?\n"

    @property
    def solution(self) -> str:
        return "\n".join(self.steps + (f"Answer: {self.answer}",))

    @property
    def document(self) -> str:
        return self.prompt + self.solution

    def chat_messages(self, rng: random.Random) -> list[dict]:
        """A user turn in one of several phrasings and the worked solution as the assistant's reply."""
        user = rng.choice(CHAT_PHRASINGS).format(q=self.question)
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": self.solution}]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        return messages


def answer_of(text: str) -> str | None:
    """The number on the first `Answer: N` line of a completion, or None when there is none."""
    m = _ANSWER.search(text)
    return m[1] if m else None


def answer_complete(text: str) -> bool:
    """Whether a completion has written its whole answer line (generation may stop there)."""
    m = _ANSWER.search(text)
    return m is not None and text[m.end() :].startswith("\n")


def is_heldout(question: str) -> bool:
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 100
    return bucket < HELDOUT_PERCENT


def _digits(n: int) -> list[int]:
    """Least significant first."""
    return [int(c) for c in reversed(str(n))]


def _add_lines(a: int, b: int) -> list[str]:
    da, db = _digits(a), _digits(b)
    lines, carry, so_far = [], 0, ""
    for i in range(max(len(da), len(db))):
        x, y = (da[i] if i < len(da) else 0), (db[i] if i < len(db) else 0)
        s = x + y + carry
        so_far = str(s % 10) + so_far
        lines.append(f"{PLACES[i]}: {x}+{y}+{carry}={s}, carry {s // 10}, so far {so_far}")
        carry = s // 10
    if carry:
        lines.append(f"{PLACES[i + 1]}: carry {carry}, so far {carry}{so_far}")
    return lines


def _sub_lines(a: int, b: int) -> list[str]:
    """a - b for a >= b; the digits written so far keep their leading zeros, the answer drops them."""
    da, db = _digits(a), _digits(b)
    lines, borrow, so_far = [], 0, ""
    for i in range(len(da)):
        x, y = da[i], (db[i] if i < len(db) else 0)
        d = x - y - borrow
        head = f"{PLACES[i]}: {x}-{y}-{borrow}={d}"
        if d < 0:
            borrow, so_far = 1, str(d + 10) + so_far
            lines.append(f"{head}, +10={d + 10}, borrow 1, so far {so_far}")
        else:
            borrow, so_far = 0, str(d) + so_far
            lines.append(f"{head}, borrow 0, so far {so_far}")
    return lines


def _mul_digit_lines(a: int, d: int) -> list[str]:
    da = _digits(a)
    lines, carry, so_far = [], 0, ""
    for i, x in enumerate(da):
        s = x * d + carry
        so_far = str(s % 10) + so_far
        lines.append(f"{PLACES[i]}: {x}*{d}+{carry}={s}, carry {s // 10}, so far {so_far}")
        carry = s // 10
    if carry:
        lines.append(f"{PLACES[len(da)]}: carry {carry}, so far {carry}{so_far}")
    return lines


def add_problem(a: int, b: int) -> Problem:
    return Problem("add", f"{a} + {b}", tuple(_add_lines(a, b)), str(a + b))


def sub_problem(a: int, b: int) -> Problem:
    if a >= b:
        return Problem("sub", f"{a} - {b}", tuple(_sub_lines(a, b)), str(a - b))
    # a smaller first operand: subtract the other way round and negate
    lines = [f"{a} < {b}, so {a} - {b} = -({b} - {a})"] + _sub_lines(b, a)
    return Problem("sub", f"{a} - {b}", tuple(lines), str(a - b))


def mul_problem(a: int, d: int) -> Problem:
    assert 0 <= d <= 9, f"mul_problem multiplies by one digit, got {d}"
    return Problem("mul", f"{a} * {d}", tuple(_mul_digit_lines(a, d)), str(a * d))


def mul2_problem(a: int, b: int) -> Problem:
    """a times a two-digit b: one partial product per digit of b, then their column sum."""
    assert 10 <= b <= 99, f"mul2_problem multiplies by a two-digit number, got {b}"
    tens, ones = divmod(b, 10)
    lines = [f"{a}*{ones}:"] + _mul_digit_lines(a, ones)
    lines += [f"{a}*{tens}:"] + _mul_digit_lines(a, tens)
    low, high = a * ones, a * tens * 10
    lines += [f"{low}+{high}:"] + _add_lines(low, high)
    return Problem("mul2", f"{a} * {b}", tuple(lines), str(a * b))


# small expressions: (template, evaluation order) where each step names the operands by letter
_EXPR = (
    ("{a} + {b} * {c}", (("b", "*", "c"), ("a", "+", "_"))),
    ("{a} * {b} + {c}", (("a", "*", "b"), ("_", "+", "c"))),
    ("{a} * {b} - {c}", (("a", "*", "b"), ("_", "-", "c"))),
    ("({a} + {b}) * {c}", (("a", "+", "b"), ("_", "*", "c"))),
    ("({a} - {b}) * {c}", (("a", "-", "b"), ("_", "*", "c"))),
    ("{a} * ({b} + {c})", (("b", "+", "c"), ("a", "*", "_"))),
    ("{a} + {b} - {c}", (("a", "+", "b"), ("_", "-", "c"))),
    ("{a} - {b} + {c}", (("a", "-", "b"), ("_", "+", "c"))),
)
_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


def expr_problem(template: int, a: int, b: int, c: int) -> Problem:
    """Expression `_EXPR[template]`; one line per operation in evaluation order ("_" is the previous result)."""
    text, order = _EXPR[template]
    values, lines, prev = {"a": a, "b": b, "c": c}, [], None
    for x, op, y in order:
        vx, vy = (prev if x == "_" else values[x]), (prev if y == "_" else values[y])
        prev = _OPS[op](vx, vy)
        lines.append(f"{vx}{op}{vy}={prev}")
    return Problem("expr", text.format(a=a, b=b, c=c), tuple(lines), str(prev))


def _number(rng: random.Random, lo_digits: int, hi_digits: int) -> int:
    n = rng.randint(lo_digits, hi_digits)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def random_problem(rng: random.Random, kind: str | None = None, profile: Profile = TRAIN) -> Problem:
    """One problem of `kind` (drawn by the profile's weights when None), either split."""
    if kind is None:
        kinds, weights = zip(*profile.weights)
        kind = rng.choices(kinds, weights=weights)[0]
    if kind == "add":
        return add_problem(_number(rng, 2, 4), _number(rng, 2, 4))
    if kind == "sub":
        a, b = _number(rng, 2, 4), _number(rng, 2, 4)
        # mostly a >= b: negative results are the rarer case
        return sub_problem(*((a, b) if a >= b or rng.random() < 0.2 else (b, a)))
    if kind == "mul":
        return mul_problem(_number(rng, 2, 3), rng.randint(2, 9))
    if kind == "mul2":
        return mul2_problem(_number(rng, *profile.mul2_digits), _number(rng, 2, 2))
    if kind == "expr":
        t = rng.randrange(len(_EXPR))
        first, second = _EXPR[t][1]
        # operands that get multiplied (directly or through the first step's result) stay small
        small = {v for x, op, y in (first, second) if op == "*" for v in (x, y)}
        if second[1] == "*":
            small |= {first[0], first[2]}
        a, b, c = (rng.randint(2, profile.expr_small) if v in small else rng.randint(1, profile.expr_large)
                   for v in "abc")
        return expr_problem(t, a, b, c)
    raise ValueError(f"unknown arithmetic kind {kind!r}; known: {', '.join(KIND_WEIGHTS)}")


def sample(rng: random.Random, split: str, kind: str | None = None, profile: Profile = TRAIN) -> Problem:
    """A random problem from `split` ("train" or "heldout")."""
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split {split!r}: use 'train' or 'heldout'")
    while True:
        p = random_problem(rng, kind, profile)
        if is_heldout(p.question) == (split == "heldout"):
            return p


def heldout_problems(n: int, seed: int = 0, profile: Profile = EVAL) -> list[Problem]:
    """n distinct held-out problems of the evaluation profile, the same for the same (n, seed) on any machine."""
    rng = random.Random(f"heldout-{seed}")
    seen, out = set(), []
    while len(out) < n:
        p = sample(rng, "heldout", profile=profile)
        if p.question not in seen:
            seen.add(p.question)
            out.append(p)
    return out
