"""Scheduling speculative verify steps: the part of the scheduler (`Scheduler` inherits it) that builds VERIFY
launches and commits their results.

Verify steps overlap as decode steps do, chained: verify n+1 is built and launched before verify n's accepted lengths
reach the host. A chained request's last token and prefix length are future references (the device reads the prefix
length n leaves); its pages cover the worst case (n accepts every draft), and its drafts are capped by the budget
and context left in that worst case. A request whose step cannot be chained (sampling or penalties, which read the
tokens before them; near its end; a prefix-cache snapshot in reach; short of pages) waits for n. One launch may also
hold several greedy verify steps (`speculative_launch_steps`), each chained onto the one before on the device, built
and processed once: its pages, budget and context are taken at the most it can commit.
"""

import time

from kestrel.engine.batch import Batch, BatchResult
from kestrel.engine.request import Req
from kestrel.models.forward_batch import ForwardMode

# with `speculative_launch_steps` auto, launches of several verify steps only up to this batch: they were measured
# at batch 1, where the host's work per step bounds it; a large batch's step is long beside that work, and each
# request stopping early in a launch would waste the launch's later steps on every row
AUTO_LAUNCH_MAX_BATCH = 7


class VerifyScheduling:
    """Verify launches for the `Scheduler` (its state: args, runner, mm, inflight, states, future ring, stats; its
    page growth, page table, drain, reap and finish checks)."""

    def _schedule_verify(self, reqs: list[Req], updated: list[Req]) -> Batch | None:
        """The next VERIFY launch for the decoding requests `reqs` (no prefill this step), chained onto the launch
        in flight where every chained request can be; else after draining it (its results go to `updated`)."""
        if self.inflight is not None and self.inflight[0].mode != ForwardMode.VERIFY:
            # a prefill in flight samples these requests' last tokens and keeps their features: read it first, so
            # that a request it finishes (a stop token, its budget) is released and left out rather than verified on
            # memory given back
            updated += self._drain()
            self._reap()
            reqs = [r for r in reqs if not r.finished]
            if not reqs:
                return None
        links = self._chain_links()
        steps = self._launch_steps(reqs, links)
        chain = {r.rid: (links[r.rid][0], self._chained_drafts(r, *links[r.rid], steps)) for r in reqs
                 if r.rid in links}
        if any(d is None for _, d in chain.values()):
            updated += self._drain()
            self._reap()
            reqs, chain = [r for r in reqs if not r.finished], {}
            steps = self._launch_steps(reqs, {})
        return self._build_verify(reqs, chain, steps)

    def _chain_links(self) -> dict[str, tuple[int, int]]:
        """Requests of the verify launch in flight (launched, results not seen): rid -> (the future entry its last
        step's token and prefix length go to, the most tokens the launch can commit for it)."""
        if self.inflight is None or self.inflight[0].mode != ForwardMode.VERIFY:
            return {}
        b = self.inflight[0]
        return {r.rid: (f, b.launch_steps * (1 + d)) for r, f, d in zip(b.reqs, b.verify_future, b.max_drafts)}

    def _chained_drafts(self, r: Req, future: int, in_flight: int, steps: int = 1) -> int | None:
        """Drafts r's next verify may take chained onto the launch in flight, or None when it must wait for it. The
        launch in flight commits up to `in_flight` tokens: pages, budget and context are taken at the most. A launch
        of several steps (`_launch_steps` checked their room) drafts gamma in each."""
        gamma = self.args.speculative_num_draft_tokens
        if steps > 1:
            return gamma
        if not self._chainable(r):
            return None  # the host must see every earlier token (penalties, seeds) or their logprobs
        budget = r.budget_left - in_flight
        total = r.total_len + in_flight
        if budget < 1 or total >= self.context_len:
            return None  # the launch in flight may end the request
        drafts = max(0, min(gamma, budget - 1, self.context_len - total - 1))
        steps = in_flight + 1 + drafts
        if not self.mm.cache.snapshot_quiet(r, steps) or not self._grow(r, steps):
            return None
        return drafts

    def _chainable(self, r: Req) -> bool:
        """Whether r's verify steps may run before the host has seen the tokens of the ones before: plain greedy
        (no penalties or seeds reading them) and no logprobs."""
        return self.states[r.rid].plain_greedy and not r.return_logprob and not r.top_logprobs_num

    def _launch_steps(self, reqs: list[Req], links: dict[str, tuple[int, int]]) -> int:
        """Verify steps the next launch chains (`ServerArgs.launch_steps`; each of gamma drafts): that many where
        every request can take them all at their most (budget, context, no prefix-cache snapshot in reach, pages,
        grown here, after what a launch in flight may commit: `links`), the batch is small enough (auto:
        AUTO_LAUNCH_MAX_BATCH) and the speculative worker would accept them on the device, else 1."""
        steps = self.launch_steps
        if (steps == 1 or not reqs or (self.launch_max_batch is not None and len(reqs) > self.launch_max_batch)
                or not self.runner.spec.can_chain_steps(len(reqs))):
            return 1
        need = steps * (1 + self.args.speculative_num_draft_tokens)
        most = {r.rid: (links[r.rid][1] if r.rid in links else 0) + need for r in reqs}
        for r in reqs:
            m = most[r.rid]
            if (not self._chainable(r) or r.budget_left - (m - need) < need or r.total_len + m > self.context_len
                    or not self.mm.cache.snapshot_quiet(r, m)):
                return 1
        # (pages grown for a launch that falls back to one step stay the request's, for its next steps)
        return steps if all(self._grow(r, most[r.rid]) for r in reqs) else 1

    def _build_verify(self, reqs: list[Req], chain: dict[str, tuple[int, int]] | None = None,
                      steps: int = 1) -> Batch | None:
        """One VERIFY launch: each request feeds its last committed token plus up to gamma drafts, in each of
        `steps` verify steps (several: `_launch_steps` grew their pages; gamma drafts each). A request in `chain`
        (rid -> (future entry of the launch in flight, drafts)) is chained onto the launch in flight (see the module
        docstring); its pages are already grown."""
        mm, gamma = self.mm, self.args.speculative_num_draft_tokens
        chain = chain or {}
        work = []
        for r in reqs:
            if r.rid in chain:
                ref, drafts = chain[r.rid]
                work.append((r, drafts, ref))
                continue
            if steps > 1:
                work.append((r, gamma, -1))
                continue
            drafts = max(0, min(gamma, r.budget_left - 1, self.context_len - r.total_len - 1))
            # short of pages: verify the committed token alone (the room for that was made before)
            if not self._grow(r, 1 + drafts):
                drafts = 0
            if self._grow(r, 1 + drafts):
                work.append((r, drafts, -1))
        if not work:
            return None
        ids, snaps, futures, step_futures = [], [], [], []
        for r, drafts, ref in work:
            if ref >= 0:
                ids.append(-(ref + 1))
                snaps.append(None)
            else:
                ids.append(r.token_at(r.computed_len) if r.computed_len < r.known_len else -(self.future_of[r.rid] + 1))
                # (a launch of several steps has none in reach: `_launch_steps`)
                snaps.append(mm.cache.spec_snapshot(r, 1 + drafts, mm) if steps == 1 else None)
            entries = []
            for _ in range(steps):
                entries.append(self.future_next)
                self.future_next = (self.future_next + 1) % self.runner.future_size
            futures.append(entries[-1])
            step_futures.append(entries[:-1])
        reqs = [r for r, _, _ in work]
        live = mm.state.slots.used
        return Batch(
            mode=ForwardMode.VERIFY, reqs=reqs, input_ids=ids, extend_lens=[1] * len(reqs),
            prefix_lens=[r.computed_len for r in reqs], page_table=self._page_table(reqs),
            out_cache_loc=[], state_slots=[mm.mem.slot_phys(r.slot) for r in reqs], sample_rows=list(range(len(reqs))),
            future_idx=[], sampling_states=[self.states[r.rid] for r in reqs],
            want_logprobs=any(r.return_logprob for r in reqs), top_logprobs_num=max(r.top_logprobs_num for r in reqs),
            mem_ops=mm.take_ops(), max_drafts=[d for _, d, _ in work], verify_future=futures,
            chain_refs=[ref for _, _, ref in work], launch_steps=steps,
            step_futures=step_futures if steps > 1 else None,
            spec_snapshots=[None if s is None or s[1] not in live else (s[0], mm.mem.slot_phys(s[1])) for s in snaps])

    def _process_verify(self, batch: Batch, result: BatchResult | Exception) -> list[Req]:
        if isinstance(result, Exception):
            return self._process(batch, result)
        updated, now = [], time.monotonic()
        for i, r in enumerate(batch.reqs):
            r.inflight -= 1
            toks = result.spec_tokens[i]
            # the last committed token and the accepted drafts are now in the KV cache and the state
            r.computed_len += len(toks)
            r.spec_verify_ct += result.spec_steps
            r.spec_accepted += len(toks) - result.spec_steps  # (each step's last token is the target's own)
            self.stats.spec_verify_steps += result.spec_steps
            self.stats.spec_draft_tokens += result.spec_drafted[i]
            self.stats.spec_accepted_tokens += len(toks) - result.spec_steps
            self.mm.cache.spec_after(r, result.spec_snapshots[i], self.mm)
            if r.finished:
                continue
            for j, tok in enumerate(toks):
                r.output_ids.append(tok)
                self.stats.generation_tokens += 1
                if result.spec_logprobs is not None:
                    tops = result.spec_top_logprobs[i]
                    r.keep_logprobs(result.spec_logprobs[i][j], None if tops is None else tops[j])
                if r.first_token_at is None:
                    r.first_token_at = now
                self._check_finish(r, tok)
                if r.finished:
                    break
            updated.append(r)
        self._reap()
        return updated
