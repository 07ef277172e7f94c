"""The speculative worker's verify planning (`SpecWorker` inherits it): the one-off profile of the target's verify
step per batch bucket, whether pruning can pay at a batch at all, the plan of each step, and the acceptance that
blocks drafted from the context have had (which the planner prices them by)."""

import logging
import time

import torch

from kestrel.engine.batch import Batch
from kestrel.models.forward_batch import ForwardMode
from kestrel.spec.planner import StepProfile, VerifyPlanner

log = logging.getLogger(__name__)

# below this many requests a step there is nothing for the planner to save (DESIGN §4)
PLANNER_MIN_BATCH = 8
# the verify planner prices a block drafted from the context by the acceptance such blocks have had (per position,
# the chance the target accepts it given it accepted the ones before), not by the drafter's confidences, which are
# low by construction there: an EMA over pruned steps' lookup blocks, from an optimistic prior (a context match is
# usually a repetition that continues)
LOOKUP_ACCEPT_PRIOR = 0.8
LOOKUP_ACCEPT_EMA = 0.05
# off: lookup blocks priced by the drafter's confidences (the behaviour before the estimate)
PRICE_LOOKUP_BLOCKS = True


class Planning:
    """Verify planning for the `SpecWorker` (its state: runner, drafter, gamma, graphs, profile, plan_cost, overhead,
    lookup_accept; its target forward and forward batches)."""

    @staticmethod
    def _bucket(batch: int) -> int:
        return 1 << (batch - 1).bit_length()

    def _profiled(self, batch: int) -> None:
        bucket = self._bucket(batch)
        if bucket not in self.profile:
            self.profile[bucket] = self._measure(bucket)
            self.plan_cost[bucket] = self._measure_plan_cost(bucket)

    def _worth_planning(self, batch: int) -> bool:
        """Whether any plan can beat verify-all at this batch: the most pruning can save (every block cut to its
        last token) against what planning costs. On a launch-bound target the verify step costs about the same at
        every block length (a flat profile), and planning would only add its own cost to every step."""
        self._profiled(batch)
        bucket = self._bucket(batch)
        rows = {L: full for L, _, full in self.profile[bucket]}
        return rows[max(rows)] - rows[min(rows)] > self.plan_cost.get(bucket, 0.0)

    def _measure_plan_cost(self, batch: int) -> float:
        """One-off: a planning step's drafting and planning time less a whole step's drafting (zero features)."""
        dev = self.runner.device
        feats = torch.zeros(batch, self.drafter.cfg.feature_size, dtype=self.drafter.fc.weight.dtype, device=dev)
        x0 = torch.zeros(batch, dtype=torch.long, device=dev)

        def draft(confidence: bool) -> None:
            if self.draft_graphs is not None and self.draft_graphs.bucket(batch) is not None:
                d = self.draft_graphs.run(feats, x0, confidence)
            else:
                d = self.drafter.propose(feats, x0, self.gamma, want_probs=False, want_confidence=confidence)
            if confidence:
                self._plan(d.confidence, [self.gamma] * batch)
            d.tokens.tolist()

        def timed(confidence: bool) -> float:
            times = []
            for _ in range(6):
                start = time.perf_counter()
                draft(confidence)
                times.append(time.perf_counter() - start)
            return sorted(times[1:])[2]  # the first is a warm-up

        with torch.inference_mode():
            cost = max(timed(True) - timed(False), 0.0)
        log.info("planning cost at batch %d: %.3f ms a step", batch, cost * 1e3)
        return cost

    def _plan_confidence(self, confidence: torch.Tensor, looked: list[int]) -> torch.Tensor:
        """The per-position acceptance the planner prices each block by: the drafter's confidences, and for the
        blocks drafted from the context (rows `looked`) the acceptance such blocks have had (`lookup_accept`)."""
        if not looked or not PRICE_LOOKUP_BLOCKS:
            return confidence
        confidence = confidence.clone()
        confidence[looked] = torch.tensor(self.lookup_accept, dtype=confidence.dtype, device=confidence.device)
        return confidence

    def _learn_lookup(self, blocks: list[tuple[int, int]]) -> None:
        """Update `lookup_accept` from verified lookup blocks, (drafts kept, drafts accepted) each: positions up to
        the first rejection were each accepted or (that one) rejected; positions past it were not tried."""
        rate = self.lookup_accept
        for kept, accepted in blocks:
            for j in range(min(accepted + 1, kept)):
                rate[j] += LOOKUP_ACCEPT_EMA * (float(j < accepted) - rate[j])

    def _plan(self, confidence: torch.Tensor, max_drafts: list[int]) -> list[int]:
        self._profiled(len(max_drafts))
        key = (id(self.profile), tuple(self.profile))
        if self._step_profile[0] != key:  # built once per measured profile (host time a step)
            self._step_profile = (key, StepProfile(self.profile))
        planner = VerifyPlanner(self._step_profile[1], PLANNER_MIN_BATCH,
                                fixed=self.overhead.get(self._bucket(len(max_drafts)), 0.0))
        return planner.plan(confidence, max_drafts)

    def _measure(self, batch: int) -> list[tuple[int, float, float]]:
        """One-off: verify step time at `batch` blocks for every longest block length (one block that long among
        blocks of one, and all that long), on the scratch page and slot."""
        r, dev = self.runner, self.runner.device
        ps = r.mem.page_size

        def step(lens: list[int]) -> None:
            table = torch.full((len(lens), -(-max(lens) // ps)), r.mem.scratch_page, dtype=torch.int32)
            fake = Batch(mode=ForwardMode.VERIFY, reqs=[], input_ids=[], extend_lens=[], prefix_lens=[0] * len(lens),
                         page_table=table, out_cache_loc=[], state_slots=[r.mem.scratch_slot] * len(lens),
                         sample_rows=[], future_idx=[], sampling_states=[])
            fb = self._forward_batch(fake, torch.zeros(len(lens) * max(lens), dtype=torch.long, device=dev), lens)
            self._target(fb)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        with torch.inference_mode():
            for L in range(1, self.gamma + 2):  # warm-up (and, on CUDA, the graph of every block length)
                step([L] * batch)
            rows = StepProfile.measure(step, [batch], self.gamma, repeats=5 if dev.type == "cuda" else 2).table[batch]
        log.info("verify profile at batch %d (longest block: one / all): %s", batch,
                 ", ".join(f"{L}:{one * 1e3:.1f}/{full * 1e3:.1f}ms" for L, (one, full) in rows.items()))
        return [(L, one, full) for L, (one, full) in rows.items()]
