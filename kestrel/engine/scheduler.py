"""The scheduler: continuous batching with chunked prefill, mixed prefill + decode steps, retraction under memory
pressure, abort, first-come-first-served admission, and overlap scheduling.

One step: build batch n+1 on this thread, launch it (on a GPU from this thread: the runner only queues device
work; on a CPU, where the forward computes, on the forward thread), then process batch n's results while n+1 runs. A decode input whose token batch n has not produced yet is a future reference. A request that finishes
in batch n may already sit in batch n+1: its extra token is dropped and its memory is released only when no
submitted batch holds it (`Req.inflight`).

Speculative verify steps overlap the same way, chained (`VerifyScheduling`, kestrel/engine/verify_schedule.py).
A plain decode launch may likewise run several decode steps (`num_continuous_decode_steps`), built and processed
once, each step's tokens feeding the next on the device; a request that stops inside it drops its later tokens.
"""

import concurrent.futures
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from kestrel.config import ServerArgs
from kestrel.engine.batch import Batch, BatchResult, int_tensor, padded_rows
from kestrel.engine.model_runner import ForwardThread, ModelRunner
from kestrel.engine.page_table import HostPageTable
from kestrel.engine.request import Req, ReqStatus
from kestrel.engine.sampler import SamplingState
from kestrel.engine.verify_schedule import AUTO_LAUNCH_MAX_BATCH, VerifyScheduling
from kestrel.mem.manager import MemoryManager
from kestrel.models.forward_batch import ForwardMode

log = logging.getLogger(__name__)

# off: each step's page table is built from every request's whole page list (the baseline of HostPageTable)
PERSISTENT_PAGE_TABLE = True


def _step_major(values: list[int], steps: int) -> list[int]:
    """Per-request runs of `steps` values (request-major) reordered step-major."""
    return [x for j in range(steps) for x in values[j::steps]]


@dataclass
class SchedulerStats:
    prompt_tokens: int = 0  # prompt tokens admitted (cache hits included)
    computed_prompt_tokens: int = 0  # prompt tokens actually run through a prefill forward
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    generation_tokens: int = 0
    retractions: int = 0
    forwards: int = 0
    finished: int = 0
    decode_steps: int = 0
    # speculative decoding, summed over requests: verify steps, drafts verified (after the planner), drafts accepted
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    started: float = field(default_factory=time.monotonic)


class Scheduler(VerifyScheduling):
    def __init__(self, args: ServerArgs, runner: ModelRunner, mm: MemoryManager, stop_checker=None,
                 context_len: int | None = None):
        self.args, self.runner, self.mm = args, runner, mm
        self.page_size = args.page_size
        self.prefill_chunk = args.prefill_chunk_tokens  # prefill tokens a step (the device's default when unset)
        # admission cap; pools are sized for args.max_running_requests, so it may be lowered at run time (a benchmark
        # sweeping batch sizes on one engine), never raised above that
        self.max_running = args.max_running_requests
        self.context_len = context_len or runner.cfg.model_max_length
        # decodes a token tail to text for stop-string checks (None: token ids only)
        self.stop_checker = stop_checker
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.overlap = args.overlap
        # on a GPU a batch is launched from this thread (the runner only queues device work: graph replays, copies
        # into pinned memory, and the previous batch is processed while it runs); on a CPU the forward computes, so
        # it runs on a thread of its own, unless torch computes with several threads: a forward thread would then
        # start an OpenMP team of its own beside this thread's, and with more OpenMP threads than cores libgomp
        # throttles its spin-waits, so every parallel region of either team pays futex wake-ups (k3-small, two
        # threads: concurrency 64 at 675 against 1532 tok/s, a batch-1 generate loop in the same process at 33
        # against 123 tok/s while the engine lived). There the overlapped batches run on this thread. So the forward
        # gets a thread only where every replica's two teams find cores of their own (one torch thread and one
        # replica on two cores: yes; two threads, or two one-thread replicas, on two cores: no).
        teams = 2 * torch.get_num_threads() * args.dp_size
        cpu_thread = args.overlap and runner.device.type != "cuda" and teams <= _usable_cores()
        self.forward = ForwardThread(runner) if cpu_thread else None
        # on a CPU a one-request batch runs on this thread even with overlap on: the forward is mostly Python, so a
        # second thread only fights it for the GIL, and with one request there is almost nothing to overlap
        # (k3-tiny, one request, interleaved runs: 158.5 against 139.4 tok/s on the forward thread; k3-small even)
        self.serial_single = runner.device.type == "cpu"
        self.inflight: tuple[Batch, concurrent.futures.Future] | None = None
        self.states: dict[str, SamplingState] = {}
        self.future_next = 0
        self.future_of: dict[str, int] = {}
        self.stats = SchedulerStats()
        # each running request's physical pages as a row of a host table, synced as a step is built
        self.tables = HostPageTable(args.max_running_requests + 16, runner.mem.scratch_page)
        self.spec = args.speculative
        self.launch_steps = args.launch_steps if self.spec else 1
        self.launch_max_batch = AUTO_LAUNCH_MAX_BATCH if args.speculative_launch_steps == 0 else None
        self.decode_steps = 1 if self.spec else args.num_continuous_decode_steps
        # requests that finished since the last step returned (whatever the reason), reported exactly once
        self._finished: list[Req] = []
        self.check_invariants = False  # tests turn this on: invariants proved after every step

    # ---- requests in and out
    def add(self, req: Req) -> None:
        self.states[req.rid] = SamplingState(req.params, req.seed, req.prompt_ids, req.stop_ids)
        self.stats.prompt_tokens += len(req.prompt_ids)
        self.waiting.append(req)
        self.waiting.sort(key=lambda r: r.arrival)

    def abort(self, rid: str, message: str | None = None) -> bool:
        reason = {"type": "abort", **({"message": message} if message else {})}
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                self._finish(r, reason)
                self._forget(r)
                return True
        for r in self.running:
            if r.rid == rid and not r.finished:
                self._finish(r, reason)
                return True
        return False

    def _finish(self, r: Req, reason: dict) -> None:
        r.finish_reason = reason
        r.finished_at = time.monotonic()
        self._finished.append(r)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.inflight)

    def shutdown(self) -> None:
        if self.forward is not None:
            self.forward.shutdown()

    # ---- the loop body
    def step(self) -> list[Req]:
        """One iteration. Returns the requests that received tokens or finished."""
        updated: list[Req] = []
        batch = self._schedule(updated)
        if batch is not None and batch.mode == ForwardMode.VERIFY:
            if self.inflight is not None and self.inflight[0].mode != ForwardMode.VERIFY:
                updated += self._drain()  # a prefill's sampled tokens and features feed this step
            self._count(batch)
            result = self._run_safely(batch, resolve=not self.overlap)
            if not self.overlap:
                updated += self._process_verify(batch, result)
            else:
                # launched (on a GPU the device still runs it): the step in flight, if any, is processed meanwhile
                previous, self.inflight = self.inflight, (batch, result)
                if previous is not None:
                    updated += self._process_done(*previous)
        elif batch is None:
            if self.inflight is not None:
                updated += self._drain()
            self._reap()
        elif not self.overlap or (self.serial_single and len(batch.reqs) == 1):
            updated += self._drain()  # the batch in flight (if any) first: its tokens feed this one
            self._count(batch)
            updated += self._process(batch, self._run_safely(batch))
        else:
            self._count(batch)
            future = self.forward.submit(batch) if self.forward is not None else self._run_safely(batch, False)
            previous, self.inflight = self.inflight, (batch, future)
            if previous is not None:
                updated += self._process_done(*previous)
        if self.check_invariants:
            self.mm.check_invariants(self.running)
        # each request once, in first-seen order (one drained and then run again in the same step appears twice)
        updated = list({id(r): r for r in updated + self._finished}.values())
        self._finished = []
        return updated

    def _count(self, batch: Batch) -> None:
        self.stats.forwards += batch.launch_steps if batch.mode == ForwardMode.DECODE else 1
        if batch.mode == ForwardMode.DECODE:
            self.stats.decode_steps += batch.launch_steps
        for r in batch.reqs:
            r.inflight += 1

    def _run_safely(self, batch: Batch, resolve: bool = True) -> BatchResult | Exception:
        try:
            result = self.runner.run(batch)
            return result.resolve() if resolve else result
        except Exception as e:  # noqa: BLE001 - one failing forward fails its requests, not the engine
            log.exception("forward failed")
            return e

    def _process_done(self, batch: Batch, future) -> list[Req]:
        """Process a submitted batch once its results are in: `future` is the forward thread's future, or the
        (launched, unresolved) result of a verify step."""
        try:
            result = future.result() if isinstance(future, concurrent.futures.Future) else future
            if not isinstance(result, Exception):
                result = result.resolve()
        except Exception as e:  # noqa: BLE001
            log.exception("forward failed")
            result = e
        if batch.mode == ForwardMode.VERIFY:
            return self._process_verify(batch, result)
        return self._process(batch, result)

    def _drain(self) -> list[Req]:
        """Wait for the batch in flight and process it (before retracting or when idle)."""
        if self.inflight is None:
            return []
        previous, self.inflight = self.inflight, None
        return self._process_done(*previous)

    # ---- building a batch
    def _schedule(self, updated: list[Req]) -> Batch | None:
        self._reap()
        work = self._running_work()
        while not self._fits(work):
            if self.inflight is not None:
                updated += self._drain()
                self._reap()
            elif not self._retract_one():
                break
            work = self._running_work()
        work += self._admit(work)
        if self.spec:
            # prefill chunks run as ordinary extends; the decoding requests verify drafted blocks together
            prefill = [(r, n) for r, n in work if r.remaining > 1 or r.computed_len == 0]
            if not prefill:
                return self._schedule_verify([r for r, _ in work], updated)
            work = prefill
        steps = self._decode_steps(work)
        if steps == 1:
            work = self._grow_all(work)
        if not work:
            return None
        return self._build(work, steps)

    def _grow_all(self, work: list[tuple[Req, int]]) -> list[tuple[Req, int]]:
        """_grow for every (request, tokens) of a step, keeping those that got their pages: one check and one
        allocation when all of them fit (the same pages, in the same order, as request by request)."""
        needs = [self.mm.pages_needed(r, n) for r, n in work]
        total = sum(needs)
        if not total:
            return work
        if not self.mm.can_alloc(total, 0):
            return [(r, n) for r, n in work if self._grow(r, n)]
        pages, at = self.mm.mem.alloc_pages(total), 0
        for (r, _), need in zip(work, needs):
            r.pages.extend(pages[at : at + need])
            at += need
        return work

    def _decode_steps(self, work: list[tuple[Req, int]]) -> int:
        """Decode steps the next launch runs (`num_continuous_decode_steps`), pages grown for them: that many, or as
        many as every request can take (its budget, the context, no prefix-cache snapshot in reach), when the step
        decodes only and the pages fit; else 1 (and no pages grown)."""
        steps = self.decode_steps
        if steps == 1 or not work or any(n != 1 or r.computed_len == 0 for r, n in work):
            return 1
        for r, _ in work:
            steps = min(steps, r.budget_left, self.context_len - r.total_len)
            while steps > 1 and not self.mm.cache.snapshot_quiet(r, steps):
                steps -= 1
        if steps == 1 or not self.mm.can_alloc(sum(self.mm.pages_needed(r, steps) for r, _ in work), 0):
            return 1
        self._grow_all([(r, steps) for r, _ in work])
        return steps

    def _running_work(self) -> list[tuple[Req, int]]:
        """(request, tokens to feed) for running requests: decodes first, then prefill chunks in arrival order."""
        decode, prefill = [], []
        budget = self.prefill_chunk
        for r in sorted(self.running, key=lambda r: r.arrival):
            if r.finished:
                continue
            if r.remaining == 1:
                # its last token is out (or pending): no forward can add anything
                if r.budget_left > 0 and r.total_len < self.context_len:
                    decode.append((r, 1))
            elif budget > 0:
                n = self._chunk(r, budget)
                prefill.append((r, n))
                budget -= n
        return decode + prefill

    def _fits(self, work) -> bool:
        return self.mm.can_alloc(sum(self.mm.pages_needed(r, n) for r, n in work), 0)

    def _retract_one(self) -> bool:
        """Requeue the latest-arriving running request, freeing its memory; its output so far is kept."""
        victims = [r for r in self.running if not r.finished and r.inflight == 0]
        if not victims:
            return False
        victim = max(victims, key=lambda r: r.arrival)
        if len(victims) == 1:
            # alone and still short of pages even after eviction: it can never run
            self._finish(victim, {"type": "abort", "message": "sequence does not fit in the KV cache"})
            return True
        log.info("retracting %s (%d tokens) under memory pressure", victim.rid, victim.total_len)
        self.mm.release(victim, keep=True)
        victim.computed_len, victim.shared_pages, victim.status = 0, 0, ReqStatus.WAITING
        victim.retractions += 1
        self.stats.retractions += 1
        self.running.remove(victim)
        self.waiting.append(victim)
        self.waiting.sort(key=lambda r: r.arrival)
        return True

    def _admit(self, work) -> list[tuple[Req, int]]:
        cap = min(self.max_running, self.args.max_running_requests)
        if not self.waiting or len(self.running) >= cap:
            return []  # (the common decode step: nothing to admit, no page sums to take)
        cache = self.mm.cache
        budget = self.prefill_chunk - sum(n for r, n in work if r.remaining > 1)
        # pages the running work takes now, plus one step of decode headroom each
        reserve = sum(self.mm.pages_needed(r, n) for r, n in work) + sum(1 for r, n in work if r.remaining == 1)
        admitted = []
        while self.waiting and budget > 0 and len(self.running) < cap:
            r = self.waiting[0]
            cached = cache.match(r, self.mm)
            n = self._chunk(r, budget)
            pages = self.mm.pages_needed(r, n)
            # a retracted request comes back beside running work only when all it had fits: admitted for its first
            # chunk alone, it could be retracted for the next and admitted again for ever while the running
            # requests never decoded (speculation runs prefill chunks before verify steps)
            whole = self.mm.pages_needed(r, r.remaining) if r.retractions and self.running else pages
            if not self.mm.can_alloc(whole + reserve, cache.slots_per_request):
                cache.unmatch(r, self.mm)
                if not self.running and self.inflight is None:
                    # the pool is as empty as it gets: this request can never start
                    self.waiting.pop(0)
                    self._forget(r)
                    self._finish(r, {"type": "abort", "message": f"the request needs {whole} KV pages at once; "
                                                                 f"the pool holds {self.mm.kv.pages.capacity}"})
                    continue
                break
            self.waiting.pop(0)
            r.slot = self.mm.alloc_slot()
            if r.retractions == 0:
                r.cached_tokens = cached
                self.stats.cached_tokens += cached
            r.status = ReqStatus.RUNNING
            self.running.append(r)
            admitted.append((r, n))
            budget -= n
            reserve += pages
            if cache.chunk_limit(r) is not None:
                # r will checkpoint a branch point this step: requests behind it may share that prefix, so
                # they are matched next step, when the checkpoint exists
                break
        return admitted

    def _chunk(self, r: Req, budget: int) -> int:
        limit = self.mm.cache.chunk_limit(r)
        return min(r.remaining, budget, limit or budget)

    def _grow(self, r: Req, n: int) -> bool:
        """Give r the pages for n more tokens; False (and no change) when they cannot be had."""
        need = self.mm.pages_needed(r, n)
        if need:
            if not self.mm.can_alloc(need, 0):
                return False
            r.pages.extend(self.mm.mem.alloc_pages(need))  # (can_alloc made the room: no second check)
        return True

    def _build(self, work: list[tuple[Req, int]], steps: int = 1) -> Batch:
        """The batch feeding each (request, tokens) of work; with steps > 1 (`_decode_steps`: decode only) a launch
        of that many decode steps, whose cache locations and future entries are step-major."""
        mm = self.mm
        ids, ext, pre, sample_rows, future_idx, states, track, feature_rows = [], [], [], [], [], [], [], []
        decode_only = all(n == 1 and r.computed_len > 0 for r, n in work)
        for row, (r, n) in enumerate(work):
            start = r.computed_len
            known = max(start, min(start + n, r.known_len))
            ids += r.tokens(start, known)
            if known < start + n:  # the pending token is sampled by the batch in flight: a future reference
                ids += [-(self.future_of[r.rid] + 1)] * (start + n - known)
            ext.append(n)
            pre.append(start)
            restore, tr = mm.cache.movements(r, n + steps - 1, mm)
            if restore is not None:
                mm.restore(*restore)
            track.append(tr)
            if start < len(r.prompt_ids):
                self.stats.computed_prompt_tokens += min(start + n, len(r.prompt_ids)) - start
            if self.spec and start + n >= r.total_len - 1:
                feature_rows.append(row)
            if start + n == r.total_len:
                sample_rows.append(row)
                for _ in range(steps):
                    future_idx.append(self.future_next)
                    self.future_next = (self.future_next + 1) % self.runner.future_size
                self.future_of[r.rid] = future_idx[-1]
                states.append(self.states[r.rid])
                r.pending += steps
            r.computed_len += n + steps - 1
            mm.cache.after_forward(r, mm)
        # physical ids only now, after every allocation and free of this pass (the unified pool may have moved
        # blocks; the moves run first on the forward stream)
        reqs = [r for r, _ in work]
        table = self._page_table(reqs)
        locs = self._cache_locs(reqs, pre, [n + steps - 1 for n in ext])
        if steps > 1:
            locs, future_idx = _step_major(locs, steps), _step_major(future_idx, steps)
        # a snapshot whose slot was freed in this pass (its checkpoint already existed) is not written at all:
        # the slot may already belong to someone else
        live = mm.state.slots.used
        track = [None if t is None or t[1] not in live else (t[0], mm.mem.slot_phys(t[1])) for t in track]
        return Batch(
            mode=ForwardMode.DECODE if decode_only else ForwardMode.EXTEND, reqs=reqs, input_ids=ids,
            extend_lens=ext, prefix_lens=pre, page_table=table, out_cache_loc=locs,
            state_slots=[mm.mem.slot_phys(r.slot) for r in reqs], sample_rows=sample_rows, future_idx=future_idx,
            feature_rows=feature_rows,
            sampling_states=states, want_logprobs=any(reqs[i].return_logprob for i in sample_rows),
            top_logprobs_num=max([reqs[i].top_logprobs_num for i in sample_rows], default=0),
            mem_ops=mm.take_ops(), track=track if any(t is not None for t in track) else None, launch_steps=steps)

    def _page_table(self, reqs: list[Req]) -> torch.Tensor:
        """The requests' physical pages as a [len(reqs), longest] int32 CPU table padded with the scratch page: from
        the persistent host table (rows synced now), or built from the whole lists."""
        mem, width = self.mm.mem, max((len(r.pages) for r in reqs), default=0)

        def whole() -> torch.Tensor:
            lists = [mem.page_phys(r.pages) for r in reqs]
            return int_tensor(padded_rows(lists, width, mem.scratch_page), torch.int32).view(len(reqs), width)

        if not PERSISTENT_PAGE_TABLE:
            return whole()
        table = self.tables.gather(self.tables.sync(reqs, mem, width), width)
        if self.check_invariants:  # (tests: the rows kept in step equal the lists built whole)
            assert torch.equal(table, whole()), "the host page table's rows differ from the requests' pages"
        return table

    def _cache_locs(self, reqs: list[Req], pre: list[int], ext: list[int]) -> list[int]:
        """Each fed token's KV location (physical page * page size + offset): only the pages the step writes are
        mapped."""
        ps, mem, locs = self.page_size, self.mm.mem, []
        for r, p, n in zip(reqs, pre, ext):
            first = p // ps
            phys = mem.page_phys(r.pages[first : (p + n - 1) // ps + 1]) if n else []
            locs += [phys[i // ps - first] * ps + i % ps for i in range(p, p + n)]
        return locs

    # ---- results
    def _process(self, batch: Batch, result: BatchResult | Exception) -> list[Req]:
        updated = []
        if isinstance(result, Exception):
            for r in batch.reqs:
                r.inflight -= 1
                if not r.finished:
                    self._finish(r, {"type": "abort", "message": f"internal error: {result}"})
            if batch.mode != ForwardMode.VERIFY:  # a verify step leaves no token pending
                for row in batch.sample_rows:
                    batch.reqs[row].pending -= batch.launch_steps
            self._reap()
            return updated
        now = time.monotonic()
        rows = batch.sample_rows * batch.launch_steps  # (a launch of several decode steps: step-major tokens)
        for k, row in enumerate(rows):
            r = batch.reqs[row]
            r.pending -= 1
            if r.finished:
                continue  # (a launch's tokens after the one that finished r are dropped)
            tok = result.tokens[k]
            r.output_ids.append(tok)
            self.stats.generation_tokens += 1
            if result.logprobs is not None:
                r.keep_logprobs(result.logprobs[k], None if result.top_logprobs is None else result.top_logprobs[k])
            if r.first_token_at is None:
                r.first_token_at = now
            self._check_finish(r, tok)
            updated.append(r)
        for r in batch.reqs:
            r.inflight -= 1
        self._reap()
        return updated if batch.launch_steps == 1 else list({id(r): r for r in updated}.values())

    def _check_finish(self, r: Req, tok: int) -> None:
        p = r.params
        if tok in r.stop_ids and len(r.output_ids) >= p.min_new_tokens:
            self._finish(r, {"type": "stop", "matched": tok})
        elif len(r.output_ids) >= p.max_new_tokens or r.known_len >= self.context_len:
            self._finish(r, {"type": "length", "length": len(r.output_ids)})
        elif p.stop and self.stop_checker is not None and len(r.output_ids) >= p.min_new_tokens:
            matched = self.stop_checker(r)
            if matched is not None:
                self._finish(r, {"type": "stop", "matched": matched})

    def _reap(self) -> None:
        """Release the memory of finished requests that no submitted batch holds any more."""
        for r in [r for r in self.running if r.finished and r.inflight == 0]:
            self.running.remove(r)
            self.mm.release(r, keep=r.finish_reason.get("type") != "abort")
            r.status = ReqStatus.FINISHED
            self.stats.finished += 1
            self._forget(r)

    def _forget(self, r: Req) -> None:
        self.states.pop(r.rid, None)
        self.future_of.pop(r.rid, None)
        self.tables.forget(r.rid)
        if self.spec:
            self.runner.spec.forget(r.rid)


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
