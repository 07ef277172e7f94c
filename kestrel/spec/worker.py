"""The speculative step on the forward thread: draft, plan, verify in one target forward, accept, fold.

The scheduler hands a VERIFY Batch: per request the last committed token (not yet fed), its pages for up to
gamma + 1 new positions and its committed state slot. Here the drafter proposes gamma tokens from the target
features kept from the request's previous forward, the planner trims each block, the target verifies every block
in one VERIFY forward (KDA state read, not written; step inputs stored), the sampler's rules accept a prefix, and
ReplaySSM folds exactly the committed steps into the state. The features at the last committed position are kept
for the next draft.

When every request decodes plain greedy and nothing is pruned (the common case), the whole step runs on the device
(`greedy_step`: acceptance is the longest prefix of drafts equal to the target's argmax) and, on CUDA, as one graph:
one copy in, one launch, one copy back. Otherwise (sampling, penalties, logprobs, a pruning plan) acceptance runs
on the host: the drafting, the verify forward and the fold each replay a CUDA graph (blocks padded to one length)
and a step synchronises once (the drafts come back with the target's greedy tokens), or twice when the planner
prunes (it reads the drafter's confidences first).

With context lookup on (`--speculative-context-lookup`; a CPU's default), each request also keeps a window of its
latest tokens on the device, and a block whose first draft the drafter doubts is drafted from the context instead
(`kestrel.spec.lookup`), on both paths.
"""

import logging
import time
from pathlib import Path

import torch
from torch.profiler import record_function

import kestrel.ops as ops
from kestrel.engine.batch import Batch, BatchResult, int_tensor, padded_rows
from kestrel.engine.sampler import token_logprobs
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.models.layers.linear import cpu_kmajor_layout
from kestrel.ops import dspark as dspark_ops
from kestrel.ops import kda as kda_ops
from kestrel.spec import lookup as context_lookup
from kestrel.spec.drafter import DSparkDrafter
from kestrel.spec.planner import PlanGuard, StepProfile
from kestrel.spec.planning import LOOKUP_ACCEPT_PRIOR, PLANNER_MIN_BATCH, Planning
from kestrel.spec.verify import accept

log = logging.getLogger(__name__)

BUNDLED_DRAFTER = Path(__file__).resolve().parent.parent / "assets" / "k3-small-dspark"
# off: the CPU's greedy step runs the LM head on every verified row (the baseline of dspark_ops.accept_lazy)
LAZY_CPU_HEAD = True
# with context lookup on, a block whose first draft the drafter's confidence head puts below this is drafted from
# the context instead, where the context has a match (`kestrel.spec.lookup`; docs/benchmarks.md, issue 8)
LOOKUP_BELOW_CONFIDENCE = 0.7
# a gap between two speculative steps longer than this is the engine idling (no work), not per-step overhead
IDLE_GAP_S = 0.25
# off: every greedy step graph replay stacks its requests' features and windows into the graph's inputs and clones
# its outputs back out (four small launches a step), even when the step before served the same requests
RESIDENT_FEATURES = True


class SpecWorker(Planning):
    def __init__(self, runner, draft_path: str | None, gamma: int, rollback: str, use_planner: bool,
                 lookup: bool = False):
        self.runner = runner
        path = Path(draft_path) if draft_path else BUNDLED_DRAFTER
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no DSpark drafter at {path}: pass --speculative-draft-model-path")
        dtype = torch.float32 if runner.dtype == torch.float64 else runner.dtype
        self.drafter = DSparkDrafter.load(path, device=runner.device, dtype=dtype)
        if runner.kmajor:  # the drafter's block products are few-row too (a drafter it loads is its own)
            cpu_kmajor_layout(self.drafter)
        if gamma > self.drafter.cfg.gamma_max:
            raise ValueError(f"--speculative-num-draft-tokens {gamma} exceeds the drafter's {self.drafter.cfg.gamma_max}")
        self.gamma, self.rollback = gamma, rollback
        self.layers = self.drafter.cfg.feature_layers
        self.features: dict[str, torch.Tensor] = {}  # rid -> target features at its last processed position
        # context lookup: rid -> its latest tokens, up to the last one fed ([WINDOW] int64, -1 before the first)
        self.lookup = lookup
        self.windows: dict[str, torch.Tensor] = {}
        self.lookup_accept = [LOOKUP_ACCEPT_PRIOR] * gamma  # see LOOKUP_ACCEPT_PRIOR
        self.use_planner = use_planner
        self.profile: dict[int, list[tuple[int, float, float]]] = {}
        # per batch bucket: what planning adds to a step (drafting with the confidence head, the plan itself),
        # measured with the profile; where pruning every draft would save less than this, no step plans
        self.plan_cost: dict[int, float] = {}
        self._step_profile: tuple[object, StepProfile | None] = (None, None)  # (profile key, its StepProfile)
        # per batch bucket: seconds an engine iteration spends outside the target's verify forward (EMA): drafting,
        # acceptance, fold, and the scheduler's own work between two steps. The planner adds it to every plan's cost.
        self.overhead: dict[int, float] = {}
        self._last_end: float | None = None  # when the previous speculative step returned
        self.guard = PlanGuard()  # planned against verify-all, measured, per batch bucket
        # (batch bucket, pruned) -> [steps, requests, committed tokens, wall s, verify forward s]: benchmarks read it
        self.step_stats: dict[tuple[int, bool], list[float]] = {}
        self.window_bytes = 0  # draft-window memory of the last verify (the rollback method's cost)
        self._window_row = 0
        self.graphs = self.draft_graphs = self.step_graphs = None
        # the requests (in batch order) whose features and windows are the step graph's input rows 0..: the greedy
        # step graph writes its outputs there, and self.features / self.windows hold stale values for them until
        # _settle_resident copies them back
        self._resident: tuple | None = None  # (those requests, the graph's feature rows, its window rows)
        # `_host_ints`' column values of a padding row: a block that verifies and commits nothing on the scratch slot
        # and publishes to the futures' scratch entry
        self.pad_ints = [0, -1, 0, runner.mem.scratch_slot, 0, runner.mem.scratch_slot, runner.future_size, -1]
        if runner.device.type == "cuda" and not runner.args.disable_cuda_graph and rollback == "replay":
            from kestrel.engine.cuda_graph import DraftGraphRunner, SpecStepGraphRunner, VerifyGraphRunner

            sizes = runner.graph_batch_sizes()
            self.graphs = VerifyGraphRunner(runner.model, runner.mem, sizes, gamma + 1, runner.max_pages_per_seq(),
                                            self.layers, runner.device)
            self.draft_graphs = DraftGraphRunner(self.drafter, sizes, gamma, runner.device)
            mem = runner.mem
            self.step_graphs = SpecStepGraphRunner(
                self.greedy_step, sizes, self.drafter.cfg.feature_size, runner.dtype, runner.max_pages_per_seq(),
                self.pad_ints, mem.scratch_page, runner.device, context_lookup.WINDOW if lookup else 0)

    # ---- features from ordinary forwards
    def keep_features(self, b: Batch, captured: dict[int, torch.Tensor], rows: torch.Tensor) -> None:
        """The drafter's features of `b.feature_rows`' requests at the last token each fed (token rows `rows`)."""
        if not b.feature_rows:
            return
        self._settle_resident()
        feats = self.drafter.features_at(captured, rows)
        for k, row in enumerate(b.feature_rows):
            r = b.reqs[row]
            self.features[r.rid] = feats[k]
            if self.lookup:  # the tokens fed so far (a pending one, not yet on the host, is left out)
                end = min(b.prefix_lens[row] + b.extend_lens[row], r.known_len)
                self.windows[r.rid] = context_lookup.fill_window(
                    r.tokens(max(0, end - context_lookup.WINDOW), end), device=self.runner.device)

    def forget(self, rid: str) -> None:
        self.features.pop(rid, None)
        self.windows.pop(rid, None)

    def _settle_resident(self) -> None:
        """Copy the step graph's input rows back into the per-request features and windows (their values after the
        last step launched; the copy is queued behind it) for the requests still served: before anything but a
        chained greedy step reads those, or another batch uses the rows."""
        resident, self._resident = self._resident, None
        if resident is None:
            return
        rids, rows, window_rows = resident
        feats = rows[: len(rids)].clone()
        windows = window_rows[: len(rids)].clone() if window_rows is not None else None
        self._store(rids, feats, windows, known_only=True)  # (a request forgotten since has none)

    def _store(self, rids, feats: torch.Tensor, windows: torch.Tensor | None, known_only: bool = False) -> None:
        """Each request's next features (and context window) after a step: rows of feats (and windows) in order;
        known_only: only for requests that still have features."""
        for i, rid in enumerate(rids):
            if known_only and rid not in self.features:
                continue
            self.features[rid] = feats[i]
            if windows is not None:
                self.windows[rid] = windows[i]

    def _windows(self, b: Batch) -> list[torch.Tensor]:
        """The batch's context windows (an empty one for a request that has none)."""
        return [self.windows[q.rid] if q.rid in self.windows else context_lookup.empty_window(device=self.runner.device)
                for q in b.reqs]

    def _lookup_drafts(self, windows: torch.Tensor, x0: torch.Tensor, draft, real: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(windows with each real row's x0 appended, the drafts): a block whose first draft the drafter doubts
        (confidence below LOOKUP_BELOW_CONFIDENCE) takes the context's lookup instead, where there is one."""
        if draft.confidence is None:  # a drafter that gives no confidence (tests' oracles) keeps its drafts
            return context_lookup.step(windows, x0, real, self.gamma)[0], draft.tokens
        return context_lookup.select(windows, x0, real, self.gamma, draft.tokens, draft.confidence[:, 0],
                                     LOOKUP_BELOW_CONFIDENCE)

    def interrupted(self) -> None:
        """Another forward (a prefill) ran since the last speculative step: the next step's gap is not overhead,
        and its time must not count against the guard's mode."""
        self._last_end = None

    # ---- the verify step
    @torch.inference_mode()
    def run(self, b: Batch) -> BatchResult:
        r, dev = self.runner, self.runner.device
        t_start = time.perf_counter()
        B = len(b.reqs)
        bucket = self._bucket(B)
        planning = self.use_planner and B >= PLANNER_MIN_BATCH and self._worth_planning(B)
        # the guard may serve this step whole (the planner's measured rate trails verify-all's in this bucket)
        prune = planning and self.guard.use_planner(bucket)
        if b.launch_steps > 1 or self.greedy_on_device(b, prune):  # (the scheduler chains only such steps)
            with record_function("spec.greedy_step"):
                return self._run_greedy(b, list(b.max_drafts), bucket, planning, t_start)
        ints, table = self._host_ints(b, list(b.max_drafts))
        ints, table = r.to_device(ints), r.to_device(table)
        x0, prefix = self._resolve(ints)[:2]
        self._settle_resident()
        feats = torch.stack([self.features[q.rid] for q in b.reqs])
        windows = None
        with record_function("spec.draft"):  # the confidence head only when this step may prune or look up
            if self.draft_graphs is not None and self.draft_graphs.bucket(B) is not None:
                draft = self.draft_graphs.run(feats, x0, prune or self.lookup)
            else:
                draft = self._draft(feats, x0, prefix, prune or ("first" if self.lookup else False))
            tokens, looked = draft.tokens, []
            if self.lookup:
                windows, tokens = self._lookup_drafts(torch.stack(self._windows(b)), x0, draft,
                                                      torch.ones(B, dtype=torch.bool, device=dev))
                if prune:  # the blocks drafted from the context (host read: a plan reads the confidences anyway)
                    looked = [i for i, d in enumerate((tokens != draft.tokens).any(1).tolist()) if d]
            # a pruning plan reads the confidences now; otherwise the drafts reach the host only with the verify
            # outputs, so the host builds and launches the verify while the drafter still runs (one sync a step)
            keep = list(b.max_drafts)
            if prune:
                keep = self._plan(self._plan_confidence(draft.confidence, looked), b.max_drafts)
            drafted = tokens.tolist() if prune else None
        lens = [1 + k for k in keep]
        # below the planner every block is verified whole: use the full-block graph even when requests near their
        # end draft less (a graph per block length would be captured mid-serving)
        L = self.gamma + 1 if self.graphs is not None and not prune else max(lens)
        t_verify = time.perf_counter()
        with record_function("spec.verify"):
            # every block padded to the longest: past its own length a block's tokens are no-ops (see ForwardMode)
            n = r.to_device(lens) if prune else ints[1] + 1
            fb = self._device_batch(None, prefix, n, table, ints[3], L, x0, tokens)
            out, graphed = self._target(fb)
            self.window_bytes = sum(rec.nbytes() for rec in fb.replay.values())
            top = ops.argmax(out.logits).tolist() if any(st.params.greedy for st in b.sampling_states) else None
            if drafted is None:
                drafted = tokens.tolist()
        t_verify = time.perf_counter() - t_verify
        drafts = [drafted[i][: keep[i]] for i in range(B)]
        with record_function("spec.accept"):
            results = [accept(out.logits[i * L : i * L + lens[i]], drafts[i], st, top and top[i * L : i * L + lens[i]])
                       for i, st in enumerate(b.sampling_states)]
        commit = [len(a.tokens) for a in results]  # the last committed token and the accepted drafts
        self._learn_lookup([(keep[i], commit[i] - 1) for i in looked])
        snaps = [None] * B
        taken = []
        for i, snap in enumerate(b.spec_snapshots or [None] * B):
            ok = snap is not None and snap[0] <= commit[i]
            taken.append(ok)
            snaps[i] = snap if ok else None
        with record_function("spec.fold"):
            commit_t = ops.host_ints(commit, dev, torch.int32)
            if graphed and not any(snaps):
                self.graphs.fold(commit_t)
            else:
                self._fold(fb, fb.state_slots, commit_t, snaps)
            rows = ops.host_ints([i * L + commit[i] - 1 for i in range(B)], dev)
            feats = self.drafter.features_at(out.captured, rows)
            self._publish(ints, r.to_device([a.tokens[-1] for a in results]), commit_t, prefix)
        if windows is not None:  # the accepted drafts (the last token, the next step's x0, is appended then)
            windows = context_lookup.append(windows, tokens, commit_t - 1)
        self._store([q.rid for q in b.reqs], feats, windows)
        res = BatchResult(tokens=[a.tokens[-1] for a in results], spec_tokens=[a.tokens for a in results],
                          spec_drafted=keep, spec_snapshots=taken)
        self._account(b, bucket, planning, prune, commit, t_start, t_verify)
        if b.want_logprobs or b.top_logprobs_num:
            sel = ops.host_ints([i * L + j for i, a in enumerate(results) for j in range(len(a.tokens))], dev)
            toks = ops.host_ints([t for a in results for t in a.tokens], dev)
            lp, top = token_logprobs(out.logits[sel], toks, b.top_logprobs_num)
            lp = lp.tolist()
            top = None if top is None else [list(zip(i, v)) for i, v in zip(top[1].tolist(), top[0].tolist())]
            res.spec_logprobs, res.spec_top_logprobs = [], []
            k = 0
            for a in results:
                res.spec_logprobs.append(lp[k : k + len(a.tokens)])
                res.spec_top_logprobs.append(None if top is None else top[k : k + len(a.tokens)])
                k += len(a.tokens)
        return res

    def _account(self, b: Batch, bucket: int, planning: bool, prune: bool, commit: list[int], t_start: float,
                 t_verify: float, steps: int = 1) -> None:
        """A launch's times (of `steps` verify steps): the planner's overhead estimate and guard, and the per-bucket
        step statistics."""
        B = len(b.reqs)
        t_end = time.perf_counter()
        if planning:
            over = t_end - t_start - t_verify
            # the host work between the previous step and this one (scheduling, result processing) is part of every
            # step too; a longer gap is the engine idling, not overhead
            between = t_start - self._last_end if self._last_end is not None else -1.0
            busy = 0.0 <= between < IDLE_GAP_S
            over += between if busy else 0.0
            self.overhead[bucket] = over if bucket not in self.overhead else 0.8 * self.overhead[bucket] + 0.2 * over
            if busy:
                self.guard.record(bucket, prune, sum(commit), t_end - t_start + between)
        self._last_end = t_end
        st = self.step_stats.setdefault((bucket, prune), [0, 0, 0, 0.0, 0.0])
        for i, v in enumerate((steps, steps * B, sum(commit), t_end - t_start, t_verify)):
            st[i] += v

    def _target(self, fb: ForwardBatch):
        """The target's verify forward: a CUDA graph when one serves the batch, else eager; (output, graphed)."""
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.run(fb), True
        return self.runner.model(fb), False

    def _host_ints(self, b: Batch, keep: list[int], rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's per-request integers as host tensors, padded to `rows` (default: the batch) with blocks that
        verify nothing on the scratch page and slot: ints [8, rows] int64 (last committed token or a future
        reference, drafts allowed (-1: a padding row), prefix length, state slot, snapshot steps (0: none), snapshot
        slot, the future entry this step publishes to, the future entry of the step whose prefix length this one
        takes (-1: none, `prefix length` holds it)) and table [rows, width] int32 pages. A launch of several steps
        (`Batch.launch_steps`) gets ints [steps, 8, rows]: step k + 1 of each request chained onto its step k."""
        mem = self.runner.mem
        B = len(b.reqs) if b.reqs else len(keep)
        pad = rows - B if rows else 0
        snaps = [s or (0, mem.scratch_slot) for s in (b.spec_snapshots or [None] * B)]
        ids = b.input_ids if b.reqs else [0] * B
        steps = b.launch_steps
        futures = b.verify_future if steps == 1 else [f[0] for f in b.step_futures]
        cols = [ids, keep, b.prefix_lens, b.state_slots, [s[0] for s in snaps], [s[1] for s in snaps],
                futures or [self.pad_ints[6]] * B, b.chain_refs or [-1] * B]
        flat = padded_rows(cols, B + pad, self.pad_ints)
        for k in range(1, steps):
            before = [f[k - 1] for f in b.step_futures]
            after = [f[k] for f in b.step_futures] if k < steps - 1 else b.verify_future
            cols[0], cols[4], cols[5] = [-(f + 1) for f in before], [0] * B, [mem.scratch_slot] * B
            cols[6], cols[7] = after, before
            flat += padded_rows(cols, B + pad, self.pad_ints)
        ints = int_tensor(flat).view(*((steps,) if steps > 1 else ()), len(cols), B + pad)
        return ints, self.runner.table(b, B + pad)

    def _device_batch(self, ids: torch.Tensor | None, prefix: torch.Tensor, n: torch.Tensor, table: torch.Tensor,
                      slots: torch.Tensor, L: int, x0: torch.Tensor | None = None,
                      drafts: torch.Tensor | None = None) -> ForwardBatch:
        """The VERIFY batch of blocks padded to L, from device tensors alone (a CUDA graph can build it): block i
        feeds n[i] real tokens from position prefix[i]; past them (and in blocks with n = 0) tokens write their
        latents to the scratch page and attend to their block's real keys only (at least one key). ids None: the
        blocks [x0, drafts[:, :L - 1]], built in the same launch."""
        mem = self.runner.mem
        B = n.shape[0]
        pos, locs, keys, n32, made = dspark_ops.block_positions(prefix, n, table, mem.page_size, mem.scratch_page, L,
                                                                x0 if ids is None else None, drafts)
        return ForwardBatch(ForwardMode.VERIFY, made if ids is None else ids, pos, [L] * B, [0] * B, mem=mem,
                            page_table=table, out_cache_loc=locs, state_slots=slots, capture_layers=self.layers,
                            spec_rollback=self.rollback, verify_lens_t=n32, key_lens_t=keys)

    def _forward_batch(self, b: Batch, ids: torch.Tensor, lens: list[int], L: int | None = None) -> ForwardBatch:
        """The VERIFY batch of blocks of `lens` tokens padded to L (default: the longest); one host-to-device copy
        of the step's integers."""
        ints, table = self._host_ints(b, [n - 1 for n in lens])
        ints, table = self.runner.to_device(ints), self.runner.to_device(table)
        _, prefix, n, _ = self._resolve(ints)
        return self._device_batch(ids, prefix, n, table, ints[3], L or max(lens))

    def _resolve(self, ints: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each request's last committed token and prefix length on the device (a future reference reads the token
        a step not yet seen by the host produces, and a chained row takes the prefix length that step leaves), its
        block's token count and whether it is a real request (`_host_ints`' ints; one launch for all four)."""
        return dspark_ops.resolve(ints[0], ints[2], ints[7], self.runner.future, self.runner.future_prefix, ints[1])

    def _publish(self, ints: torch.Tensor, tokens: torch.Tensor, commit: torch.Tensor, prefix: torch.Tensor) -> None:
        """A step's last token and prefix length after its commit, per request, into the futures a chained step
        reads."""
        at = ints[6]
        self.runner.future[at] = tokens.long()
        self.runner.future_prefix[at] = prefix + commit.long()

    def _fold(self, fb: ForwardBatch, slots: torch.Tensor, commit, snapshots) -> None:
        """ReplaySSM: commit each block's accepted steps onto its KDA state, every layer of the verify pass."""
        mem, layers = self.runner.mem, list(fb.replay)
        kda_ops.fold_layers([fb.replay[l] for l in layers], [mem.conv_state(l) for l in layers],
                            [mem.ssm_state(l) for l in layers], slots, commit, snapshots)

    def _draft(self, feats: torch.Tensor, x0: torch.Tensor, prefix: torch.Tensor, confidence: bool | str):
        """gamma greedy drafts per request from its features and last committed token, which sits at position
        `prefix` (the drafter does not read it; a test's oracle drafter does). confidence: True for every
        position's, "first" for the first position's only (the context lookup's gate), False for none."""
        return self.drafter.propose(feats, x0, self.gamma, want_probs=False, want_confidence=bool(confidence),
                                    confidence_positions=1 if confidence == "first" else None)

    # ---- the greedy step on the device
    def can_chain_steps(self, batch: int) -> bool:
        """Whether a launch of `batch` plain greedy requests may chain several verify steps (`Batch.launch_steps`):
        ReplaySSM, and no verify plan at that batch (a plan reads each step's confidences on the host)."""
        if self.rollback != "replay":
            return False
        return not (self.use_planner and batch >= PLANNER_MIN_BATCH and self._worth_planning(batch))

    def greedy_on_device(self, b: Batch, prune: bool) -> bool:
        """Whether acceptance can run on the device: every request plain greedy (no penalties, no held-back stop
        tokens; once a step is past min_new_tokens so is every later one), no logprobs, no pruning plan, ReplaySSM."""
        if prune or self.rollback != "replay" or b.want_logprobs or b.top_logprobs_num:
            return False
        return all(st.plain_greedy for st in b.sampling_states)

    def greedy_step(self, feats: torch.Tensor, ints: torch.Tensor, table: torch.Tensor, L: int | None = None,
                    windows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A whole greedy speculative step on the device, with no host synchronisation (a CUDA graph captures it):
        draft gamma tokens, verify every block whole, accept the longest prefix of drafts equal to the target's
        argmax, fold the committed steps (and the snapshots they reach) into the state, and gather the features at
        each block's last committed position. feats [B, F]; ints [8, B] and table as `_host_ints` builds them.

        Returns (packed [B, gamma + 2] int64: the drafts, the target's token after the accepted ones, the number
        accepted; the next features [B, F]; the context windows [B, W] after the step, given windows). Padding rows
        (drafts allowed -1) verify and commit nothing. Blocks are padded to L tokens (default gamma + 1; at least 1
        + the most drafts a block may keep). With windows (context lookup), blocks whose first draft the drafter
        doubts are drafted from the context (`_lookup_drafts`)."""
        r, G = self.runner, self.gamma
        L = L or G + 1
        _, keep, _, slots, snap_n, snap_slot = ints[:6]
        B = keep.shape[0]
        x0, prefix, n, real = self._resolve(ints)
        draft = self._draft(feats, x0, prefix, "first" if windows is not None else False)
        tokens = draft.tokens
        if windows is not None:
            windows, tokens = self._lookup_drafts(windows, x0, draft, real)
        fb = self._device_batch(None, prefix, n, table, slots, L, x0, tokens)
        if LAZY_CPU_HEAD and r.device.type == "cpu":
            # on a CPU the LM head runs afterwards on the rows acceptance reads (accept_lazy), not on every block row
            fb.logits_indices = fb.input_ids.new_empty(0)
            out = r.model(fb)
            packed, commit, snap_steps, rows = dspark_ops.accept_lazy(out.hidden, r.model.lm_head, tokens, keep, n,
                                                                      snap_n, L)
            self._publish(ints, packed[:, G], commit, prefix)
        else:
            out = r.model(fb)
            # the acceptance also publishes the next token and commit for a chained step (no separate writes)
            packed, commit, snap_steps, rows = dspark_ops.accept_greedy(out.logits, tokens, keep, n, snap_n,
                                                                        (r.future, r.future_prefix, ints[6], prefix))
        self._fold(fb, slots, commit, (snap_steps, snap_slot))
        nxt = self.drafter.features_at(out.captured, rows)
        self.window_bytes = sum(rec.nbytes() for rec in fb.replay.values())  # from shapes: no synchronisation
        self._window_row = self.window_bytes // max(B, 1)
        if windows is not None:  # the accepted drafts (the last token, the next step's x0, is appended then)
            windows = context_lookup.append(windows, tokens, packed[:, G + 1])
        return packed, nxt, windows

    def _run_greedy(self, b: Batch, keep: list[int], bucket: int, planning: bool, t_start: float) -> BatchResult:
        """The step of `greedy_step`, replayed as one CUDA graph where one serves the batch. Returns as soon as the
        step is launched: the result is deferred (one device-to-host copy, read when the scheduler resolves it),
        so the host can build and launch the next step, chained onto this one, while the device runs it."""
        B, G = len(b.reqs), self.gamma
        runner = self.step_graphs
        graphed = (runner is not None and runner.bucket(B) is not None
                   and b.page_table.shape[1] <= runner.max_pages)
        ints, table = self._host_ints(b, keep, runner.bucket(B) if graphed else None)
        steps = b.launch_steps
        step_ints = list(ints) if steps > 1 else [ints]
        rids = tuple(q.rid for q in b.reqs)
        # the same requests in the same order as the step before: the graph's input rows already hold their
        # features and windows (it writes its outputs there), so nothing is stacked in or copied out
        chained = graphed and self._resident is not None and self._resident[0] == rids and RESIDENT_FEATURES
        if not chained:
            self._settle_resident()
        windows = self._windows(b) if self.lookup and not chained else None
        if graphed:
            feats = None if chained else [self.features[q.rid] for q in b.reqs]
            for k, ints_k in enumerate(step_ints):
                # a later step of the launch reads the rows the one before wrote, on the same pages
                first = k == 0
                packed = runner.run(feats if first else None, ints_k, table if first else None,
                                    windows if first else None)[0]
                if steps > 1:  # (copied out before the next replay overwrites it)
                    packed = runner.keep_packed(k, packed[:B])
            self.window_bytes = self._window_row * B
            packed = BatchResult.pending(packed[:B] if steps == 1 else runner.kept_packed(steps, B))
            self._resident = (rids, runner.features, runner.windows)  # (the rows the graph writes)
        else:
            feats = torch.stack([self.features[q.rid] for q in b.reqs])
            windows = None if windows is None else torch.stack(windows)
            table, outs = self.runner.to_device(table), []
            for ints_k in step_ints:
                # eager: blocks only as long as the longest (as the host path pads them)
                packed, feats, windows = self.greedy_step(feats, self.runner.to_device(ints_k), table, 1 + max(keep),
                                                          windows)
                outs.append(packed)
            packed = BatchResult.pending(outs[0] if steps == 1 else torch.stack(outs))
            self._store(rids, feats, windows)
        # the verify forward is not timed apart inside one graph: the profile's whole-block time stands for it
        t_verify = dict((L, full) for L, _, full in self.profile[bucket])[self.gamma + 1] if planning else 0.0

        def finish() -> BatchResult:
            tokens, taken = [], []
            snaps = b.spec_snapshots or [None] * B
            rows = packed.resolve().tokens
            for i, st in enumerate(b.sampling_states):
                toks = []
                for step in (rows if steps > 1 else [rows]):  # each step's accepted drafts and the target's token
                    row = step[i]
                    toks += row[: row[G + 1]] + [row[G]]
                for t in toks:
                    st.advance(t)
                tokens.append(toks)
                taken.append(snaps[i] is not None and snaps[i][0] <= len(toks))
            self._account(b, bucket, planning, False, [len(t) for t in tokens], t_start, t_verify, steps)
            return BatchResult(tokens=[t[-1] for t in tokens], spec_tokens=tokens,
                               spec_drafted=[steps * k for k in keep], spec_snapshots=taken, spec_steps=steps)

        return BatchResult([], deferred=finish)

    # ---- start-up (the planning itself: kestrel/spec/planning.py)
    def prepare(self, max_batch: int) -> None:
        """At start-up, like decode graph capture: measure the planner's profile of every bucket up to `max_batch`
        and capture every graph a step may replay (drafting with and without confidence, verify and fold of each
        block length the planner may leave, the greedy step's single graph); else each is captured the first time a step needs it, which stalls
        that step (~0.4 s for a fold graph on the H200: the planner's steps paid it inside the measured run)."""
        if self.use_planner:
            for batch in range(PLANNER_MIN_BATCH, max_batch + 1):
                self._profiled(batch)
        if self.graphs is not None:
            for bs in self.graphs.batch_sizes:
                if bs <= max_batch:
                    # whole blocks at every size (below the planner, and when its guard serves a step whole); with
                    # the planner, drafting with confidence and the verify + fold of every block length too
                    planning = self.use_planner and bs >= PLANNER_MIN_BATCH
                    self.step_graphs.ensure(bs)  # greedy steps: the whole step as one graph
                    self.draft_graphs.ensure(bs, False)
                    for L in range(1 if planning else self.gamma + 1, self.gamma + 2):
                        self.graphs.ensure_fold(bs, L)
                    if planning:
                        self.draft_graphs.ensure(bs, True)
