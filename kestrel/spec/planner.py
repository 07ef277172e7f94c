"""The verify planner: keep a draft position only while its expected gain covers its marginal cost.

A one-off profile gives the target's verify step time against the number of verify tokens at each batch size
(on a GPU a staircase: flat while the tokens fit the current kernel wave, steep where a new wave starts). Blocks
of different lengths are not free to mix: the recurrent KDA verify pads every block to the longest, so the
profile is two-dimensional, (total tokens, longest block): for each block length L it times one block of L among
blocks of 1 and all blocks of L, and a plan in between is interpolated on its token count. Each step, the
confidence head's per-position acceptance probabilities give every draft position its survival probability (the
chance it is reached and accepted); positions are added best-first while the expected tokens per second of the
whole step still rise. Below `min_batch` there is nothing to save: no pruning.

The profile and the confidence head are predictions; `PlanGuard` checks them against what the steps achieve. Per
batch bucket it keeps the measured output tokens per second of planned steps and of verify-all steps and serves
the better one, probing the other now and then, so a miscalibrated profile or head costs a few probe steps rather
than the run (on the H200 a planner trusting its profile alone ran at 0.33-0.47x of verify-all at batch 64).
"""

import bisect
import time
from collections.abc import Callable

import numpy as np
import torch


class StepProfile:
    """Measured verify step time as a function of (batch size, total verify tokens, longest block), interpolated.

    table: batch bucket b -> [(L, t_one, t_all)] for L = 1 ... gamma + 1, where t_one is the step time with one
    block of L tokens and b - 1 blocks of one, t_all with all b blocks of L.
    """

    def __init__(self, table: dict[int, list[tuple[int, float, float]]]):
        self.table = {b: {L: (one, full) for L, one, full in rows} for b, rows in table.items()}
        self.buckets = sorted(self.table)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def cost(self, batch: int, tokens: int, longest: int) -> float:
        b = self.buckets[min(bisect.bisect_left(self.buckets, batch), len(self.buckets) - 1)]
        rows = self.table[b]
        L = min(max(longest, 1), max(rows))
        one, full = rows[L]
        if L == 1:
            return full
        # the bucket was measured at b blocks: scale the token count to it, then place it between the two shapes
        t = tokens * b / max(batch, 1)
        lo, hi = b - 1 + L, b * L
        w = min(max((t - lo) / (hi - lo), 0.0), 1.0)
        return one + w * (full - one)

    def cost_many(self, batch: int, tokens: np.ndarray, longest: np.ndarray) -> np.ndarray:
        """`cost` for many (tokens, longest) pairs at one batch size (numpy: the planner runs on the host every
        step, where a torch CPU op costs ~10 us of dispatch against ~1 us for numpy's)."""
        b = self.buckets[min(bisect.bisect_left(self.buckets, batch), len(self.buckets) - 1)]
        one, full = self._arrays(b)
        L = np.clip(longest, 1, len(one))
        lo_one, hi_full = one[L - 1], full[L - 1]
        t = np.asarray(tokens, dtype=np.float64) * b / max(batch, 1)
        lo, hi = (b - 1 + L).astype(np.float64), (b * L).astype(np.float64)
        w = np.clip((t - lo) / np.maximum(hi - lo, 1e-12), 0.0, 1.0)
        return np.where(L == 1, hi_full, lo_one + w * (hi_full - lo_one))

    def _arrays(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(t_one, t_all) of bucket b by block length 1 .. top, cached."""
        if b not in self._cache:
            rows = self.table[b]
            self._cache[b] = tuple(np.array([rows[L][i] for L in range(1, max(rows) + 1)]) for i in (0, 1))
        return self._cache[b]

    @classmethod
    def measure(cls, step: Callable[[list[int]], None], batches: list[int], gamma: int,
                repeats: int = 3) -> "StepProfile":
        """step(block_lengths) runs one verify forward over blocks of those lengths; the median of `repeats`."""

        def timed(lens: list[int]) -> float:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                step(lens)
                times.append(time.perf_counter() - start)
            return sorted(times)[len(times) // 2]

        table = {}
        for b in batches:
            rows = []
            for L in range(1, gamma + 2):
                full = timed([L] * b)
                one = full if L == 1 or b == 1 else timed([L] + [1] * (b - 1))
                rows.append((L, one, full))
            table[b] = rows
        return cls(table)



class VerifyPlanner:
    def __init__(self, profile: StepProfile, min_batch: int = 8, margin: float = 1.05, fixed: float = 0.0):
        # prune only where the profile predicts a clear gain over verifying every draft: the profile is timed, so
        # a plan within its noise of verify-all is as likely to lose as to win. `fixed`: the rest of a step
        # (drafting, acceptance, the fold), seconds, which no pruning shortens
        self.profile, self.min_batch, self.margin, self.fixed = profile, min_batch, margin, fixed

    def plan(self, confidence: torch.Tensor, max_drafts: list[int]) -> list[int]:
        """confidence [B, gamma]: P(target accepts position i | it accepted < i). Returns drafts kept per request.

        Positions are taken best-first by survival probability (the chance a position is reached and accepted,
        falling along a request's positions, so best-first extends each request in order); the plan is the prefix
        of that order with the highest expected tokens per second. Vectorised: the planner runs every step on the
        host, so its cost must stay far below a step's (at batch 256, 1,792 candidates).
        """
        B = len(max_drafts)
        if B < self.min_batch:
            return list(max_drafts)
        survival = np.cumprod(confidence.detach().to(torch.float64).cpu().numpy(), axis=1)  # [B, gamma]
        allowed = np.arange(survival.shape[1])[None, :] < np.asarray(max_drafts)[:, None]
        rows, cols = np.nonzero(allowed)  # row-major: (request, position) order
        vals = survival[rows, cols]
        if vals.size == 0:
            return list(max_drafts)
        # best first; ties in (request, position) order, which the row-major flattening already has
        order = np.argsort(-vals, kind="stable")
        # every request verifies its last token and yields one token whatever happens: the prefix of k candidates
        expected = B + np.concatenate([[0.0], np.cumsum(vals[order])])
        tokens = B + np.arange(order.size + 1, dtype=np.float64)
        longest = np.concatenate([[1], np.maximum.accumulate(cols[order] + 2)])
        rate = expected / (self.fixed + self.profile.cost_many(B, tokens, longest))
        k = int(np.argmax(rate))  # the first best, like a strict improvement scan
        if rate[k] <= self.margin * rate[-1]:
            return list(max_drafts)
        return np.bincount(rows[order[:k]], minlength=B).tolist()


class PlanGuard:
    """Online check of the planner: per batch bucket, the EMA of measured output tokens per second of planned steps
    and of verify-all steps; `use_planner(bucket)` serves the better mode and every `probe_every`-th step the other
    one (each mode is tried `warm` times first, the planner first). Steps with other work in between are not
    recorded by the caller, so an idle engine does not count against either mode."""

    def __init__(self, probe_every: int = 16, warm: int = 2, alpha: float = 0.2):
        self.probe_every, self.warm, self.alpha = probe_every, warm, alpha
        self.rate: dict[int, dict[bool, float]] = {}
        self.count: dict[int, dict[bool, int]] = {}
        self.steps: dict[int, int] = {}

    def use_planner(self, bucket: int) -> bool:
        n = self.count.setdefault(bucket, {True: 0, False: 0})
        if min(n.values()) < self.warm:
            return n[True] <= n[False]
        self.steps[bucket] = self.steps.get(bucket, 0) + 1
        rate = self.rate[bucket]
        best = rate[True] >= rate[False]
        return (not best) if self.steps[bucket] % self.probe_every == 0 else best

    def record(self, bucket: int, planned: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        r = tokens / seconds
        rates = self.rate.setdefault(bucket, {})
        rates[planned] = r if planned not in rates else (1 - self.alpha) * rates[planned] + self.alpha * r
        self.count.setdefault(bucket, {True: 0, False: 0})[planned] += 1
