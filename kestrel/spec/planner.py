"""The verify planner: keep a draft position only while its expected gain covers its marginal cost.

A one-off profile gives the target's verify step time against the number of verify tokens at each batch size
(on a GPU a staircase: flat while the tokens fit the current kernel wave, steep where a new wave starts). Each
step, the confidence head's per-position acceptance probabilities give every draft position its survival
probability (the chance it is reached and accepted); positions are added best-first while the expected tokens
per second of the whole step still rise. Below `min_batch` there is nothing to save: no pruning.
"""

import bisect
import time
from collections.abc import Callable

import torch


class StepProfile:
    """Measured verify step time as a function of (batch size, total verify tokens), interpolated."""

    def __init__(self, table: dict[int, list[tuple[int, float]]]):
        # batch bucket -> [(total tokens, seconds)] sorted by tokens
        self.table = {b: sorted(rows) for b, rows in table.items()}
        self.buckets = sorted(self.table)

    def cost(self, batch: int, tokens: int) -> float:
        b = self.buckets[min(bisect.bisect_left(self.buckets, batch), len(self.buckets) - 1)]
        rows = self.table[b]
        # the bucket was measured at b rows: scale the token count to it
        t = tokens * b / max(batch, 1)
        xs = [x for x, _ in rows]
        i = bisect.bisect_left(xs, t)
        if i == 0:
            return rows[0][1]
        if i == len(rows):
            (x0, y0), (x1, y1) = rows[-2], rows[-1]
        else:
            (x0, y0), (x1, y1) = rows[i - 1], rows[i]
        return y0 + (y1 - y0) * (t - x0) / max(x1 - x0, 1e-9)

    @classmethod
    def measure(cls, step: Callable[[int, int], None], batches: list[int], gamma: int, repeats: int = 3) -> "StepProfile":
        """step(batch, tokens_per_request) runs one verify forward; the median of `repeats` timings is kept."""
        table = {}
        for b in batches:
            rows = []
            for n in range(1, gamma + 2):
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    step(b, n)
                    times.append(time.perf_counter() - start)
                rows.append((b * n, sorted(times)[len(times) // 2]))
            table[b] = rows
        return cls(table)


class VerifyPlanner:
    def __init__(self, profile: StepProfile, min_batch: int = 8):
        self.profile, self.min_batch = profile, min_batch

    def plan(self, confidence: torch.Tensor, max_drafts: list[int]) -> list[int]:
        """confidence [B, gamma]: P(target accepts position i | it accepted < i). Returns drafts kept per request."""
        B = len(max_drafts)
        if B < self.min_batch:
            return list(max_drafts)
        survival = torch.cumprod(confidence.double().cpu(), dim=1)
        # every request verifies its last token and yields one token whatever happens
        kept, expected, tokens = [0] * B, float(B), B
        best_rate, best = expected / self.profile.cost(B, tokens), list(kept)
        cands = sorted(((float(survival[r, i]), r, i) for r in range(B) for i in range(max_drafts[r])),
                       key=lambda c: (-c[0], c[1], c[2]))
        for s, r, i in cands:
            # survival falls along a request's positions, so best-first order extends each request in order
            kept[r] = i + 1
            expected += s
            tokens += 1
            rate = expected / self.profile.cost(B, tokens)
            if rate > best_rate:
                best_rate, best = rate, list(kept)
        return best
