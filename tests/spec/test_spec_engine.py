"""Speculative decoding in the engine: lossless against plain decoding, with the cache, retraction and overlap."""

import math

import pytest
import torch

from kestrel.engine.sampler import SamplingState
from kestrel.engine.sampling_params import SamplingParams
from kestrel.spec import lookup
from kestrel.spec import planning as planning_mod
from kestrel.spec import worker as worker_mod
from kestrel.spec.drafter import DSparkDrafter
from kestrel.spec.verify import accept
from tests.engine.helpers import drive, greedy_reference, make_core, random_prompts
from tests.mem.test_radix_cache import BASE

G = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def drafter_dir(tiny64, tmp_path_factory):
    """A random (untrained) drafter for k3-tiny: verification must be lossless whatever it proposes."""
    path = tmp_path_factory.mktemp("dspark")
    DSparkDrafter.from_target(tiny64, feature_layers=(0, 2, 3), hidden_size=32, num_heads=2, intermediate_size=64,
                              correction_size=64, confidence_size=16).save(path, dtype=torch.float32)
    return path


def spec_core(tiny64, drafter_dir, **kw):
    return make_core(tiny64, speculative_algorithm="dspark", speculative_draft_model_path=str(drafter_dir), **kw)


@pytest.mark.parametrize("rollback", ["replay", "snapshot"])
@pytest.mark.parametrize("page_size,overlap", [(1, True), (16, False)])
def test_greedy_speculation_equals_plain_decoding(tiny64, drafter_dir, rollback, page_size, overlap):
    prompts = [BASE[:n] + p for n, p in zip([0, 64, 100, 130] * 4, random_prompts(16, seed=page_size, lo=1, hi=40))]
    core = spec_core(tiny64, drafter_dir, page_size=page_size, disable_overlap_schedule=not overlap,
                     chunked_prefill_size=48, max_total_tokens=300, speculative_state_rollback=rollback,
                     speculative_num_draft_tokens=4, state_track_interval=64)
    reqs = [core.make_request(p, G) for p in prompts]
    done = drive(core, reqs, seed=page_size)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 12)
        assert done[r.rid].spec_verify_ct > 0
    assert core.scheduler.stats.cached_tokens > 0 and core.scheduler.stats.retractions > 0
    core.shutdown()


def test_greedy_speculation_on_unified_memory_equals_plain_decoding(tiny64, drafter_dir):
    """The unified pool's state slots are strided views (each slot's layers interleaved in one block): the fold of
    every layer at once must update them in place like the static pools, through block moves and retraction. The
    steps' page tables come from the persistent host table (`HostPageTable`), whose rows must follow the pages'
    moves, retraction and prefix-cache sharing (the scheduler checks each against the whole lists)."""
    prompts = [BASE[:n] + p for n, p in zip([0, 64, 100, 130] * 4, random_prompts(16, seed=5, lo=1, hi=50))]
    core = spec_core(tiny64, drafter_dir, page_size=1, enable_unified_memory=True, chunked_prefill_size=48,
                     max_total_tokens=112, max_state_slots=10, speculative_num_draft_tokens=4)
    reqs = [core.make_request(p, G) for p in prompts]
    done = drive(core, reqs, seed=5)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 12)
        assert done[r.rid].spec_verify_ct > 0
    stats = core.scheduler.stats
    assert stats.cached_tokens > 0 and stats.retractions > 0
    assert core.mm.mem.page_epoch > 0  # (pages moved under the table)
    core.shutdown()


def test_trained_like_drafter_accepts_and_planner_keeps_output(tiny64, drafter_dir):
    """A drafter that proposes the target's own next tokens is accepted; the planner (batch >= 8) only trims."""
    prompts = random_prompts(10, seed=3, lo=5, hi=30)
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4)
    worker = core.runner.spec
    worker.profile = {16: [(n, 1e-3 * (1 + 0.01 * n), 1e-3 * (1 + 0.05 * n)) for n in range(1, 6)]}

    # an oracle drafter: the reference greedy continuation, so acceptance is high and the planner has work
    draft, gamma = worker._draft, worker.gamma

    def oracle(features, last_token, prefix, confidence):
        out = draft(features, last_token, prefix, confidence)
        for i, (rid, pos) in enumerate(zip(current, prefix.tolist())):
            r = by_rid[rid]
            k = pos + 1 - len(r.prompt_ids)  # outputs before the block (a chained step's host view lags behind)
            out.tokens[i] = torch.tensor(greedy_reference(tiny64, r.prompt_ids, k + gamma)[k:])
            if out.confidence is not None:
                out.confidence[i] = 0.9
        return out

    reqs = [core.make_request(p, {**G, "max_new_tokens": 9}) for p in prompts]
    by_rid = {r.rid: r for r in reqs}
    current = []
    run = worker.run

    def run_and_track(b):
        current[:] = [r.rid for r in b.reqs]
        return run(b)

    worker.run, worker._draft = run_and_track, oracle
    done = drive(core, reqs)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 9)
    accepted = sum(done[r.rid].spec_accepted for r in reqs)
    steps = sum(done[r.rid].spec_verify_ct for r in reqs)
    assert accepted / steps > 1.5
    # the engine's counters (exported by /metrics) agree with the requests' meta_info
    m = core.metrics()
    assert m["spec_verify_steps_total"] == steps and m["spec_accepted_tokens_total"] == accepted
    assert accepted <= m["spec_draft_tokens_total"] <= 4 * steps
    assert m["spec_accept_length"] == pytest.approx((accepted + steps) / steps)
    core.shutdown()


def _oracle_drafts(core, tiny64, seed: int):
    """Make the worker's drafter propose the reference greedy continuation with one token spoiled at a random
    position per block (or none): acceptance lengths vary from 0 to gamma."""
    worker = core.runner.spec
    rng = torch.Generator().manual_seed(seed)
    by_rid, current = {}, []
    run, draft, gamma = worker.run, worker._draft, worker.gamma

    def oracle(features, last_token, prefix, confidence):
        out = draft(features, last_token, prefix, confidence)
        for i, (rid, pos) in enumerate(zip(current, prefix.tolist())):
            r = by_rid[rid]
            k = pos + 1 - len(r.prompt_ids)  # outputs before the block (a chained step's host view lags behind)
            block = greedy_reference(tiny64, r.prompt_ids, k + gamma)[k:]
            spoil = int(torch.randint(0, gamma + 1, (1,), generator=rng))
            if spoil < gamma:
                block[spoil] = (block[spoil] + 1) % tiny64.cfg.vocab_size
            out.tokens[i] = torch.tensor(block)
        return out

    def run_and_track(b):
        current[:] = [r.rid for r in b.reqs]
        res = run(b).resolve()  # resolving early only waits: the scheduler's own resolve returns the same
        by_rid["snapshots taken"] = by_rid.get("snapshots taken", 0) + sum(res.spec_snapshots)
        by_rid["chained rows"] = by_rid.get("chained rows", 0) + sum(ref >= 0 for ref in b.chain_refs)
        if b.launch_steps > 1:  # rows verified in launches of several steps, and those chained onto a launch
            chained = sum(ref >= 0 for ref in b.chain_refs)
            by_rid["launch rows"] = by_rid.get("launch rows", 0) + len(b.reqs)
            by_rid["chained launch rows"] = by_rid.get("chained launch rows", 0) + chained
        return res

    worker.run, worker._draft = run_and_track, oracle
    return by_rid


@pytest.mark.parametrize("page_size", [1, 16])
def test_device_acceptance_equals_host_acceptance(tiny64, drafter_dir, page_size):
    """The greedy step on the device (one CUDA graph on a GPU) against acceptance on the host, over drafts whose
    accepted length varies: the same tokens (the reference's), the same accepted drafts per request, the same
    prefix-cache snapshots taken inside draft windows (interval 8 < gamma + 1 steps)."""
    prompts = [BASE[:n] + p for n, p in zip([0, 40, 70] * 3, random_prompts(9, seed=11, lo=3, hi=30))]
    runs, states = [], []
    for on_device in (True, False):
        core = spec_core(tiny64, drafter_dir, page_size=page_size, speculative_num_draft_tokens=5,
                         disable_verify_planner=True, state_track_interval=8)
        worker = core.runner.spec
        calls = {"device": 0}
        decide = worker.greedy_on_device

        def counted(b, prune, decide=decide, on_device=on_device):
            used = on_device and decide(b, prune)
            calls["device"] += used
            return used

        worker.greedy_on_device = counted
        by_rid = _oracle_drafts(core, tiny64, seed=page_size)
        reqs = [core.make_request(p, {**G, "max_new_tokens": 17}) for p in prompts]
        by_rid.update({r.rid: r for r in reqs})
        done = drive(core, reqs, seed=2)
        out = [(done[r.rid].output_ids, done[r.rid].spec_accepted, done[r.rid].spec_verify_ct) for r in reqs]
        for (ids, _, _), p in zip(out, prompts):
            assert ids == greedy_reference(tiny64, p, 17)
        assert (calls["device"] > 0) == on_device
        runs.append((out, core.scheduler.stats.cached_tokens, by_rid["snapshots taken"]))
        mem = core.runner.mem
        states.append([t.clone() for l in tiny64.cfg.kda_layer_ids for t in (mem.conv_state(l), mem.ssm_state(l))])
        core.shutdown()
    assert runs[0] == runs[1]
    assert runs[0][2] > 0  # windows crossed checkpoint positions
    # every slot bit for bit: the checkpoints the prefix cache still holds, and the poison of every freed slot
    for a, b in zip(*states):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert sum(a for _, a, _ in runs[0][0]) > len(prompts)  # drafts were accepted, not only rejected


def test_host_acceptance_requests_batch_with_device_ones(tiny64, drafter_dir):
    """Requests the device step cannot serve (logprobs, a repetition penalty, min_new_tokens holding back EOS)
    in the same engine as plain greedy ones: each gets exactly what plain decoding gives it."""
    prompts = random_prompts(6, seed=12, lo=3, hi=25)
    eos = tiny64.cfg.eos_token_ids[0]
    params = [dict(G), {**G, "repetition_penalty": 1.3}, dict(G), {**G, "min_new_tokens": 10, "ignore_eos": False,
              "stop_token_ids": [eos]}, dict(G), dict(G)]
    logprob = [False, False, True, False, False, False]
    outs = []
    for spec in (False, True):
        core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4) if spec else make_core(tiny64)
        reqs = [core.make_request(p, q, return_logprob=lp) for p, q, lp in zip(prompts, params, logprob)]
        done = drive(core, reqs, seed=4)
        outs.append([(done[r.rid].output_ids, [round(x, 9) for x in done[r.rid].output_logprobs]) for r in reqs])
        core.shutdown()
    assert outs[0] == outs[1]
    assert outs[1][2][1] and len(outs[1][2][1]) == len(outs[1][2][0])


@pytest.mark.parametrize("page_size,lazy_head,launch_steps", [(1, True, 1), (16, True, 1), (16, False, 1),
                                                               (1, True, 2), (16, False, 2), (16, True, 3)])
def test_chained_verify_steps_equal_plain_decoding(tiny64, drafter_dir, page_size, lazy_head, launch_steps,
                                                   monkeypatch):
    """Verify steps chained onto the one in flight (overlap on: the next step's last token and prefix length come
    from the device), over drafts whose accepted length varies: every request gets the reference's tokens, also
    one that stops at a token while its chained step is in flight; chained rows run; retraction and prefix-cache
    hits happen; ownership holds after every step and everything is given back at the end. lazy_head False: the
    GPU's greedy step (the LM head on every verified row, the acceptance publishing the chained step's inputs).
    launch_steps > 1: launches of that many verify steps, each chained onto the one before on the device, and
    launches chained onto a launch, run beside one-step launches (near a request's end or a snapshot)."""
    monkeypatch.setattr(worker_mod, "LAZY_CPU_HEAD", lazy_head)
    prompts = [BASE[:n] + p for n, p in zip([0, 40, 70, 100] * 3, random_prompts(12, seed=21, lo=3, hi=30))]
    new = 30
    # stop tokens from the reference continuation: those requests end mid-stream, not at a budget
    stops = [[greedy_reference(tiny64, p, new)[9 + i]] if i % 3 == 0 else [] for i, p in enumerate(prompts)]
    core = spec_core(tiny64, drafter_dir, page_size=page_size, speculative_num_draft_tokens=4,
                     disable_verify_planner=True, state_track_interval=64, chunked_prefill_size=48,
                     max_total_tokens=240, speculative_launch_steps=launch_steps)
    by_rid = _oracle_drafts(core, tiny64, seed=page_size)
    reqs = [core.make_request(p, {**G, "max_new_tokens": new, "ignore_eos": False, "stop_token_ids": s})
            for p, s in zip(prompts, stops)]
    by_rid.update({r.rid: r for r in reqs})
    done = drive(core, reqs, seed=5)
    for r, p, s in zip(reqs, prompts, stops):
        want = greedy_reference(tiny64, p, new, stop_ids=tuple(s) + tuple(tiny64.cfg.eos_token_ids))
        assert done[r.rid].output_ids == want, f"request with a {len(p)}-token prompt"
    assert by_rid["chained rows"] > 0
    if launch_steps > 1:
        assert by_rid["launch rows"] > 0 and by_rid["chained launch rows"] > 0
    else:
        assert "launch rows" not in by_rid
    assert sum(done[r.rid].spec_accepted for r in reqs) > sum(done[r.rid].spec_verify_ct for r in reqs)
    stats = core.scheduler.stats
    assert stats.cached_tokens > 0 and stats.retractions > 0
    core.mm.cache.flush(core.mm)
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    core.shutdown()


def test_planner_overhead_counts_host_time_between_steps(tiny64, drafter_dir):
    """The fixed cost the planner adds to every plan includes the engine's host work between two speculative steps
    (scheduling, result processing), not only drafting, acceptance and the fold: a 0.2 s stall between steps (below
    the idle cut-off) must show in the per-bucket estimate; without it the planner underprices every step and
    prunes drafts that pay."""
    import time

    from kestrel.spec.worker import IDLE_GAP_S

    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, disable_overlap_schedule=True)
    worker = core.runner.spec
    worker.profile = {b: [(n, 1e-3 * (1 + 0.01 * n), 1e-3 * (1 + 0.05 * n)) for n in range(1, 6)] for b in (8, 16)}
    worker.plan_cost = {8: 0.0, 16: 0.0}  # planning pays at every batch: the steps plan (and record their overhead)
    stall = 0.2
    assert stall < IDLE_GAP_S
    for p in random_prompts(8, seed=5, lo=5, hi=20):
        core.add_request(core.make_request(p, {**G, "max_new_tokens": 30}))
    steps = 0
    while core.has_work():
        core.step()
        steps += 1
        time.sleep(stall)
    assert steps >= 8 and worker.overhead
    assert min(worker.overhead.values()) > 0.5 * stall
    core.shutdown()


def test_rejection_sampling_matches_the_target_distribution():
    """Draft a fixed token, accept by p(d), resample from the residual: the first token is distributed as p."""
    V, n = 6, 6000
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0]] * 3, dtype=torch.float64)
    p = torch.softmax(logits[0] / 0.9, -1)
    counts = torch.zeros(V)
    params = SamplingParams.from_dict({"temperature": 0.9})
    for seed in range(n):
        st = SamplingState(params, seed, [])
        out = accept(logits, [3, 0], st)
        counts[out.tokens[0]] += 1
    expected = p * n
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < (V - 1) + 5 * math.sqrt(2 * (V - 1)), stat


def test_engine_guard_records_both_modes(tiny64, drafter_dir):
    """Wired into the speculative step: at batch >= 8 both modes get measured steps, and whichever the guard
    serves, greedy output is the reference's."""
    prompts = random_prompts(10, seed=4, lo=5, hi=25)
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, disable_overlap_schedule=True)
    worker = core.runner.spec
    worker.profile = {16: [(n, 1e-3 * (1 + 0.01 * n), 1e-3 * (1 + 0.05 * n)) for n in range(1, 6)]}
    reqs = [core.make_request(p, {**G, "max_new_tokens": 24}) for p in prompts]
    done = drive(core, reqs)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 24)
    counts = worker.guard.count[16]
    assert counts[True] >= 2 and counts[False] >= 2, counts
    core.shutdown()


def test_no_planning_where_no_plan_can_pay(tiny64, drafter_dir):
    """Where the profile is flat (a verify step costs the same at every block length, as on a launch-bound GPU)
    and planning costs something, no step drafts with confidence or prunes; where pruning could save more than
    planning costs, the planner runs."""
    prompts = random_prompts(10, seed=6, lo=5, hi=25)
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, disable_overlap_schedule=True)
    worker = core.runner.spec
    worker.profile = {16: [(n, 1e-3, 1e-3 * (1 + 0.001 * n)) for n in range(1, 6)]}
    worker.plan_cost = {16: 1e-4}  # more than the 4e-6 s that cutting every block to one token would save
    assert not worker._worth_planning(10)
    reqs = [core.make_request(p, {**G, "max_new_tokens": 12}) for p in prompts]
    done = drive(core, reqs)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 12)
    assert not worker.guard.count and not any(pruned for _, pruned in worker.step_stats)
    assert any(bucket >= 8 for bucket, _ in worker.step_stats)  # steps at batch >= 8 ran, all whole
    worker.plan_cost = {16: 1e-6}
    assert worker._worth_planning(10)
    core.shutdown()


def test_profile_and_plan_cost_measured_on_first_use(tiny64, drafter_dir):
    """Without a preset profile, the first planning-size step measures the bucket's verify profile and the cost of
    planning (drafting with confidence + the plan, less plain drafting), and greedy output stays the reference's."""
    prompts = random_prompts(9, seed=8, lo=5, hi=20)
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=3, disable_overlap_schedule=True)
    worker = core.runner.spec
    reqs = [core.make_request(p, {**G, "max_new_tokens": 6}) for p in prompts]
    for r in reqs:
        core.add_request(r)
    while core.has_work():
        core.step()
    for r, p in zip(reqs, prompts):
        assert r.output_ids == greedy_reference(tiny64, p, 6)
    assert set(worker.profile) == {16} and set(worker.plan_cost) == {16}
    assert worker.plan_cost[16] >= 0 and len(worker.profile[16]) == 4
    core.shutdown()


def _matching_prompt(model, p: list[int], tries: int = 6) -> list[int] | None:
    """p + [x] + p[-3:], where x is the target's greedy token after that very prompt (a fixed point, searched for):
    the first step's window then ends with (p[-1], x), which occurs earlier, so a context lookup finds a match."""
    x = greedy_reference(model, p, 1)[0]
    for _ in range(tries):
        q = p + [x] + p[-3:]
        y = greedy_reference(model, q, 1)[0]
        if y == x:
            return q
        x = y
    return None


@pytest.mark.parametrize("overlap", [False, True])
def test_context_lookup_windows_follow_the_committed_tokens(tiny64, drafter_dir, monkeypatch, overlap):
    """Context lookup on, and every block with a context match taking it (the threshold above any confidence):
    greedy output equals plain decoding through prefix-cache hits, retraction, host-side acceptance (a logprob
    request) and (with overlap) chained steps;
    lookups replace drafts; and (overlap off, where the host's view is current) at the start of every step each
    request's window holds exactly its tokens before its last committed one, the step's x0, which it appends."""
    monkeypatch.setattr(worker_mod, "LOOKUP_BELOW_CONFIDENCE", 2.0)
    # a random target rarely repeats itself: prompts built so that the first step's window has a match
    looping = [q for q in (_matching_prompt(tiny64, BASE[:n] + p) for n, p in
                           zip([0, 64, 100] * 4, random_prompts(12, seed=8, lo=3, hi=30))) if q is not None]
    assert len(looping) >= 2
    prompts = looping + [BASE[:n] + p for n, p in zip([0, 64, 100], random_prompts(3, seed=9, lo=3, hi=30))]
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, speculative_context_lookup="on",
                     disable_overlap_schedule=not overlap, chunked_prefill_size=48, max_total_tokens=300,
                     state_track_interval=64)
    worker = core.runner.spec
    assert worker.lookup
    run, merge = worker.run, worker._lookup_drafts
    seen = {"rows": 0, "lookups": 0}

    def checked_run(b):
        if not overlap:
            for q in b.reqs:
                assert worker.windows[q.rid].tolist() == lookup.fill_window((q.prompt_ids + q.output_ids)[:-1]).tolist()
                seen["rows"] += 1
        return run(b)

    def counted_merge(windows, x0, draft, real):
        out = merge(windows, x0, draft, real)
        seen["lookups"] += int((out[1] != draft.tokens).any(1).sum())
        return out

    worker.run, worker._lookup_drafts = checked_run, counted_merge
    # one request asks for logprobs: while it runs, steps accept on the host (`run`'s own path) and keep windows too
    reqs = [core.make_request(p, {**G, "max_new_tokens": 20}, return_logprob=i == 1) for i, p in enumerate(prompts)]
    done = drive(core, reqs, seed=9)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 20)
    assert seen["lookups"] > 0 and (overlap or seen["rows"] > 0)
    assert core.scheduler.stats.retractions > 0 and core.scheduler.stats.cached_tokens > 0
    assert not worker.windows  # forgotten with their requests
    core.shutdown()


def test_planner_prices_lookup_blocks_by_their_acceptance(tiny64, drafter_dir):
    """With the planner pruning (batch >= 8) and context lookup on, a block drafted from the context is priced by
    the acceptance lookup blocks have had (`SpecWorker.lookup_accept`), not by the drafter's confidences in drafts
    it did not propose; the estimate learns from each pruned step's lookup blocks. Greedy output is unchanged.
    (A random target seldom repeats itself, so here every other block takes "context" drafts made up for it.)"""
    prompts = [BASE[:n] + p for n, p in zip([0, 40, 70] * 4, random_prompts(10, seed=13, lo=3, hi=30))]
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, speculative_context_lookup="on")
    worker = core.runner.spec
    worker.profile = {16: [(n, 1e-3 * (1 + 0.01 * n), 1e-3 * (1 + 0.05 * n)) for n in range(1, 6)]}
    seen = {"priced": 0, "plans": 0}
    price, merge = worker._plan_confidence, worker._lookup_drafts

    def every_other(windows, x0, draft, real):
        windows, tokens = merge(windows, x0, draft, real)
        tokens = tokens.clone()
        tokens[::2] = (draft.tokens[::2] + 1) % tiny64.cfg.vocab_size
        return windows, tokens

    def checked(confidence, looked):
        out = price(confidence, looked)
        seen["plans"] += 1
        assert set(range(0, out.shape[0], 2)) <= set(looked)  # (and any block the real lookup took)
        want = torch.tensor(worker.lookup_accept, dtype=out.dtype)
        for i in range(out.shape[0]):
            if i in looked:
                assert torch.equal(out[i].cpu(), want)
                seen["priced"] += 1
            else:
                assert torch.equal(out[i], confidence[i])
        return out

    worker._lookup_drafts, worker._plan_confidence = every_other, checked
    reqs = [core.make_request(p, {**G, "max_new_tokens": 16}) for p in prompts]
    done = drive(core, reqs, seed=4)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 16)
    assert seen["plans"] > 0 and seen["priced"] > 0
    assert worker.lookup_accept != [worker_mod.LOOKUP_ACCEPT_PRIOR] * worker.gamma  # it learned
    core.shutdown()


def test_lookup_acceptance_estimate_counts_the_positions_tried():
    """`_learn_lookup`: of a block with k drafts kept and a accepted, positions 0 .. a - 1 count as accepted,
    position a (when a < k) as rejected, and positions past it are left alone."""
    w = worker_mod.SpecWorker.__new__(worker_mod.SpecWorker)
    w.lookup_accept = [0.5] * 4
    w._learn_lookup([(4, 1)])  # accepted position 0, rejected position 1
    a = planning_mod.LOOKUP_ACCEPT_EMA
    assert w.lookup_accept == pytest.approx([0.5 + a * 0.5, 0.5 - a * 0.5, 0.5, 0.5])
    w._learn_lookup([(2, 2), (0, 0)])  # both kept drafts accepted: nothing past them was tried; none kept: nothing
    assert w.lookup_accept[2:] == [0.5, 0.5] and w.lookup_accept[1] > 0.5 - a * 0.5


def test_prompt_cached_up_to_its_last_token_equals_plain_decoding(tiny64, drafter_dir):
    """A prompt whose prefix is cached with a KDA checkpoint right before its last token (a decode snapshot of an
    earlier request): a verify step needs the drafter's features at the token before its input, which only a
    forward gives, and the checkpoint must be restored into the request's slot. The match stops short of that
    checkpoint, so a prefill chunk runs first (before, the request went straight to a verify step with a
    poisoned slot and no features, and decoded garbage)."""
    core = spec_core(tiny64, drafter_dir, page_size=1, speculative_num_draft_tokens=4, state_track_interval=64,
                     disable_verify_planner=True)
    first = random_prompts(1, seed=31, lo=40, hi=40)[0]
    done = drive(core, [core.make_request(first, {**G, "max_new_tokens": 40})])
    seq = first + next(iter(done.values())).output_ids
    assert core.mm.cache.stats.matched_tokens == 0
    # a decode snapshot of the first request sits at 64 tokens: at 65 the match stops short of it, at 66 it is used
    for n, reused in ((65, 0), (66, 64)):
        prompt = seq[:n]
        req = core.make_request(prompt, G)
        done = drive(core, [req])
        assert done[req.rid].output_ids == greedy_reference(tiny64, prompt, 12)
        assert done[req.rid].cached_tokens == reused
    assert core.mm.cache.stats.matched_tokens >= 2 * 64
    core.shutdown()


def _run_together(core, reqs) -> dict:
    """Add every request at once and step until all finish; rid -> request."""
    for r in reqs:
        core.add_request(r)
    done = {}
    while core.has_work():
        done.update((r.rid, r) for r in core.step() if r.finished)
    return done


@pytest.mark.parametrize("overlap", [True, False])
def test_request_stopping_at_its_first_token_leaves_the_verify_step(tiny64, drafter_dir, overlap):
    """Requests prefilled together, one of which stops at the first token its prefill samples: with the overlap
    scheduler that prefill is still in flight when the next (verify) step is planned, and the stopped request must
    not be in that step (it was: its memory and drafter features were released when the prefill's results were
    read, and the verify step failed for every request in it)."""
    prompts = random_prompts(3, seed=41, lo=5, hi=20)
    first = greedy_reference(tiny64, prompts[0], 1)[0]
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4, disable_overlap_schedule=not overlap,
                     disable_verify_planner=True)
    reqs = [core.make_request(p, {**G, "ignore_eos": False, "stop_token_ids": [first] if i == 0 else []})
            for i, p in enumerate(prompts)]
    done = _run_together(core, reqs)
    assert done[reqs[0].rid].output_ids == [first]
    for r, p in zip(reqs[1:], prompts[1:]):
        want = greedy_reference(tiny64, p, 12, stop_ids=tuple(tiny64.cfg.eos_token_ids))
        assert done[r.rid].output_ids == want and done[r.rid].finish_reason["type"] != "abort"
    core.shutdown()


def test_auto_launch_steps_only_below_batch_eight(tiny64, drafter_dir):
    """`speculative_launch_steps` auto: two steps a launch where the step is one CUDA graph (here forced on the
    CPU engine), only in launches of fewer than 8 requests; the outputs stay the reference's."""
    from kestrel.config import ServerArgs
    from kestrel.engine import verify_schedule as sched

    assert ServerArgs(device="cuda", speculative_algorithm="dspark").launch_steps == 2
    assert ServerArgs(device="cuda", speculative_algorithm="dspark", disable_cuda_graph=True).launch_steps == 1
    assert ServerArgs(device="cuda", speculative_algorithm="dspark",
                      speculative_state_rollback="snapshot").launch_steps == 1
    assert ServerArgs(device="cpu", speculative_algorithm="dspark").launch_steps == 1
    prompts = random_prompts(10, seed=43, lo=3, hi=20)
    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=3, disable_verify_planner=True,
                     max_running_requests=10)
    core.scheduler.launch_steps = 2  # (what auto gives on CUDA; the cap is auto's)
    seen, run = [], core.runner.spec.run

    def counted(b):
        seen.append((len(b.reqs), b.launch_steps))
        return run(b)

    core.runner.spec.run = counted
    lens = [12] * 3 + [40] * 7  # three leave early: the batch of ten (room for two steps each) shrinks to seven
    reqs = [core.make_request(p, {**G, "max_new_tokens": n}) for p, n in zip(prompts, lens)]
    done = _run_together(core, reqs)
    for r, p, n in zip(reqs, prompts, lens):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, n)
    assert all(steps == 1 for b, steps in seen if b > sched.AUTO_LAUNCH_MAX_BATCH)
    assert any(steps == 2 for b, steps in seen) and any(b > sched.AUTO_LAUNCH_MAX_BATCH for b, _ in seen)
    core.shutdown()


def test_served_requests_report_their_verify_steps(tiny64, drafter_dir):
    """The core process's updates carry spec_verify_ct and the accepted drafts to the front end's mirror, so that
    a served response's meta_info reports them as the offline Engine's does."""
    from kestrel.engine.engine import output_dict
    from kestrel.engine.request import Req
    from kestrel.server.engine_client import EngineClient, Group, Track
    from kestrel.server.engine_proc import CoreLoop
    from kestrel.server.metrics import ServerMetrics
    from tests.server.test_engine_proc import Outbox, run

    core = spec_core(tiny64, drafter_dir, speculative_num_draft_tokens=4)
    out = Outbox()
    loop = CoreLoop(core, None, out, parent_pid=0)
    loop._on_add("r", [5, 6, 7, 8], SamplingParams.from_dict(G), False, 0, False)
    last = run(loop, out)["r"][-1]
    assert last.finish_reason is not None and last.spec_verify_ct > 0
    assert 0 <= last.spec_accepted <= 4 * last.spec_verify_ct
    client = EngineClient(core.args)
    try:
        mirror = Req("r", [5, 6, 7, 8], SamplingParams.from_dict(G), 0, 0)
        client.metrics = ServerMetrics("m")
        client.tracks["r"] = Track(mirror, Group("g", client, []))
        client.load[0] += 1
        client._apply([last._replace(new_ids=[1] * 12, new_logprobs=[0.0] * 12, new_top_logprobs=[[]] * 12)])
        meta = output_dict(mirror, None)["meta_info"]
        assert (meta["spec_verify_ct"], meta["spec_accepted_tokens"]) == (last.spec_verify_ct, last.spec_accepted)
    finally:
        for sock in (*client.to_cores, client.from_core):
            sock.close(linger=0)
        client.ctx.term()
        core.shutdown()
