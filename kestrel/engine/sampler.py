"""Per-request sampling inside a batch: penalties, temperature, top-k / top-p / min-p, seeded draws, logprobs.

A draw uses noise that depends only on (request seed, output position): the same seed gives the same tokens
whatever the request is batched with, and a retracted request resumes with the same draws.
"""

from dataclasses import dataclass, field

import torch

import kestrel.ops as ops
from kestrel.engine.sampling_params import SamplingParams

_MASK63 = (1 << 63) - 1


@dataclass
class SamplingState:
    """What sampling remembers about one request: its seed, step and (for penalties) token counts."""

    params: SamplingParams
    seed: int
    prompt_ids: list[int]
    # tokens that end generation (EOS, stop_token_ids): held back until min_new_tokens are out
    stop_ids: frozenset[int] = frozenset()
    step: int = 0
    counts: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        # read every step of every request in a batch: worked out once from the (fixed) parameters
        p = self.params
        self.needs_counts = p.frequency_penalty != 0 or p.presence_penalty != 0 or p.repetition_penalty != 1
        self._greedy_no_counts = p.greedy and not self.needs_counts
        self._hold_until = p.min_new_tokens if self.stop_ids else 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing adjusting this step's logits (no penalty, no stop token held back): the token is the
        plain argmax, which a batch computes in one op (and a speculative step on the device)."""
        return self._greedy_no_counts and self.step >= self._hold_until

    def advance(self, token: int | None) -> None:
        """One token out: the step moves on (and, with penalties, the token is counted: it must be known)."""
        self.step += 1
        if self.needs_counts:
            self.counts[token] = self.counts.get(token, 0) + 1


@dataclass
class SampleOutput:
    tokens: torch.Tensor  # [B]
    logprobs: torch.Tensor | None  # [B] log p(token) under the model (raw logits, temperature 1)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # (values [B, k], ids [B, k])


def _noise(seed: int, step: int, n: int, device) -> torch.Tensor:
    """Exp(1) noise keyed by (seed, step); the exponential race argmax(p / q) draws from p."""
    gen = torch.Generator().manual_seed((seed * 6364136223846793005 + step * 1442695040888963407 + 1) & _MASK63)
    return torch.empty(n, dtype=torch.float64).exponential_(generator=gen).to(device)


def _apply_penalties(logits: torch.Tensor, st: SamplingState) -> torch.Tensor:
    p = st.params
    if p.repetition_penalty != 1:
        seen = ops.host_ints(sorted(set(st.prompt_ids) | set(st.counts)), logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if st.counts and (p.frequency_penalty or p.presence_penalty):
        ids = ops.host_ints(list(st.counts), logits.device)
        cnt = ops.host_ints(list(st.counts.values()), logits.device, logits.dtype)
        logits[ids] -= p.frequency_penalty * cnt + p.presence_penalty
    return logits


def _filter(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    if p.top_k > 0 and p.top_k < probs.numel():
        kth = probs.topk(p.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if p.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing the line included); a masked
        # scatter, not boolean indexing, which would read the mask back to the host
        drop = sorted_p.cumsum(0) - sorted_p > p.top_p * sorted_p.sum()
        probs = probs.scatter(0, order, torch.where(drop, 0.0, sorted_p))
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs


def adjusted_logits(row: torch.Tensor, st: SamplingState) -> torch.Tensor:
    """One row's logits after the request's penalties and min_new_tokens hold-back (a copy)."""
    row = row.clone()
    if st.needs_counts:
        row = _apply_penalties(row, st)
    if st.step < st.params.min_new_tokens and st.stop_ids:
        row[list(st.stop_ids)] = float("-inf")
    return row


def distribution(row: torch.Tensor, st: SamplingState) -> torch.Tensor:
    """The distribution a non-greedy request samples from at its current step (fp64)."""
    p = st.params
    return _filter(torch.softmax(adjusted_logits(row, st).double() / p.temperature, dim=-1), p)


def draw(probs: torch.Tensor, st: SamplingState) -> int:
    """A token from probs with the request's noise for its current step (the exponential race)."""
    return int(_draw(probs, st))


def _draw(probs: torch.Tensor, st: SamplingState) -> torch.Tensor:
    """`draw` as a 0-d device tensor (no read back)."""
    return (probs / _noise(st.seed, st.step, probs.numel(), probs.device)).argmax()


def uniform(st: SamplingState) -> float:
    """A U(0, 1) draw keyed by (seed, step), independent of `draw`'s noise (speculative acceptance tests)."""
    gen = torch.Generator().manual_seed((st.seed * 6364136223846793005 + st.step * 1442695040888963407 + 7) & _MASK63)
    return float(torch.rand((), generator=gen, dtype=torch.float64))


def sample(logits: torch.Tensor, states: list[SamplingState], want_logprobs: bool, top_logprobs_num: int) -> SampleOutput:
    """logits [B, V] -> one token per row. Advances every state by one step."""
    others = [i for i, st in enumerate(states) if not st.plain_greedy]
    if logits.dtype in (torch.float16, torch.bfloat16) and (others or want_logprobs or top_logprobs_num):
        logits = logits.float()  # (an argmax alone reads the half-precision values as they are: the same token)
    # plain greedy rows (no penalty, nothing held back) take one batched argmax
    tokens = ops.argmax(logits)
    for i in others:
        st = states[i]
        if st.params.greedy:
            tokens[i] = adjusted_logits(logits[i], st).argmax()
        else:
            tokens[i] = _draw(distribution(logits[i], st), st)
    logprobs = top = None
    if want_logprobs or top_logprobs_num:
        logprobs, top = token_logprobs(logits, tokens, top_logprobs_num)
    # the tokens stay on the device (the caller reads them back when it needs them) unless a penalty must count them
    if any(states[i].needs_counts for i in others):
        for st, t in zip(states, tokens.tolist()):
            st.advance(t)
    else:
        for st in states:
            st.step += 1
    return SampleOutput(tokens, logprobs, top)


def take_plain_greedy(states: list[SamplingState], want_logprobs: bool, top_logprobs_num: int,
                      steps: int = 1) -> bool:
    """Whether a batch's tokens are its rows' plain argmax with nothing else asked of the step (every row plain
    greedy, no logprobs). If so the states advance as `sample` would advance them (over `steps` steps: a row plain
    greedy now stays so), and the caller's argmax (a decode graph's) stands for `sample`'s."""
    if want_logprobs or top_logprobs_num or not all(st.plain_greedy for st in states):
        return False
    for st in states:
        st.step += steps
    return True


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top_n: int):
    """log p(token) under the model (raw logits, temperature 1) and the top_n alternatives."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    top = None
    if top_n:
        t = lp.topk(top_n, dim=-1)
        top = (t.values, t.indices)
    return lp.gather(1, tokens[:, None])[:, 0], top
