"""The verify planner: keep a draft position only while its expected gain covers its marginal cost.

A one-off profile gives the target's verify step time against the number of verify tokens at each batch size
(on a GPU a staircase: flat while the tokens fit the current kernel wave, steep where a new wave starts). Blocks
of different lengths are not free to mix: the recurrent KDA verify pads every block to the longest, so the
profile is two-dimensional, (total tokens, longest block): for each block length L it times one block of L among
blocks of 1 and all blocks of L, and a plan in between is interpolated on its token count. Each step, the
confidence head's per-position acceptance probabilities give every draft position its survival probability (the
chance it is reached and accepted); positions are added best-first while the expected tokens per second of the
whole step still rise. Below `min_batch` there is nothing to save: no pruning.
"""

import bisect
import time
from collections.abc import Callable

import torch


class StepProfile:
    """Measured verify step time as a function of (batch size, total verify tokens, longest block), interpolated.

    table: batch bucket b -> [(L, t_one, t_all)] for L = 1 ... gamma + 1, where t_one is the step time with one
    block of L tokens and b - 1 blocks of one, t_all with all b blocks of L.
    """

    def __init__(self, table: dict[int, list[tuple[int, float, float]]]):
        self.table = {b: {L: (one, full) for L, one, full in rows} for b, rows in table.items()}
        self.buckets = sorted(self.table)

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

    def _cost(self, batch: int, tokens: int, longest: int) -> float:
        return self.fixed + self.profile.cost(batch, tokens, longest)

    def plan(self, confidence: torch.Tensor, max_drafts: list[int]) -> list[int]:
        """confidence [B, gamma]: P(target accepts position i | it accepted < i). Returns drafts kept per request."""
        B = len(max_drafts)
        if B < self.min_batch:
            return list(max_drafts)
        survival = torch.cumprod(confidence.double().cpu(), dim=1)
        # every request verifies its last token and yields one token whatever happens
        kept, expected, tokens = [0] * B, float(B), B
        best_rate, best = expected / self._cost(B, tokens, 1), list(kept)
        cands = sorted(((float(survival[r, i]), r, i) for r in range(B) for i in range(max_drafts[r])),
                       key=lambda c: (-c[0], c[1], c[2]))
        longest = 1
        for s, r, i in cands:
            # survival falls along a request's positions, so best-first order extends each request in order
            kept[r] = i + 1
            expected += s
            tokens += 1
            longest = max(longest, i + 2)
            rate = expected / self._cost(B, tokens, longest)
            if rate > best_rate:
                best_rate, best = rate, list(kept)
        full_rate = expected / self._cost(B, tokens, longest)
        return best if best_rate > self.margin * full_rate else list(max_drafts)
