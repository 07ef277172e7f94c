"""Launches of several decode steps (`num_continuous_decode_steps`): the scheduler builds and processes a launch
once while the runner feeds each step's tokens to the next on the device. Tokens and finishes must be exactly those
of one step a launch."""

import random

import pytest

from kestrel.config import ServerArgs
from tests.engine.helpers import drive, greedy_reference, make_core, random_prompts

PROMPTS = random_prompts(20, seed=5, lo=1, hi=90)


def _launches(core) -> list[int]:
    """Records the decode steps of every launch the runner runs."""
    seen, run = [], core.runner.run

    def counted(b):
        seen.append(b.launch_steps)
        return run(b)

    core.runner.run = counted
    return seen


@pytest.mark.parametrize("steps,page_size,overlap,unified", [
    (s, p, o, False) for s in (3, 8) for p in (1, 16) for o in (False, True)] + [(5, 16, True, True)])
def test_decode_launches_are_exact(tiny64, steps, page_size, overlap, unified):
    """Budgets that end inside a launch, stop tokens met inside one, prefix-cache snapshots every 64 decode tokens
    (launches shorten to leave them to single steps), and a pool small enough to retract (unified: one byte pool
    for pages and state slots, blocks moved as it fills): every request's tokens and finish equal the
    single-request reference, pools empty at the end."""
    rng = random.Random(steps * 10 + page_size)
    # (the unified pool lends free slots' bytes to pages: fewer tokens there for the same pressure)
    pools = {"max_total_tokens": 112, "max_state_slots": 10} if unified else {"max_total_tokens": 224}
    core = make_core(tiny64, page_size=page_size, chunked_prefill_size=64, disable_overlap_schedule=not overlap,
                     num_continuous_decode_steps=steps, state_track_interval=64, enable_unified_memory=unified,
                     **pools)
    launches = _launches(core)
    reqs, expected = [], {}
    for p in PROMPTS:
        n = rng.randint(1, 30)
        ref = greedy_reference(tiny64, p, n)
        # a third of the requests stop at a token the reference produces mid-way (inside a launch, mostly)
        stop = [ref[len(ref) // 2]] if n > 4 and rng.random() < 0.35 else []
        r = core.make_request(p, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, "stop_token_ids": stop})
        reqs.append(r)
        expected[r.rid] = greedy_reference(tiny64, p, n, stop)
    done = drive(core, reqs, seed=steps + page_size)
    for r in reqs:
        out = done[r.rid]
        assert out.output_ids == expected[r.rid], f"request with a {len(r.prompt_ids)}-token prompt"
        stopped = len(out.output_ids) < r.params.max_new_tokens
        assert out.finish_reason["type"] == ("stop" if stopped else "length")
    assert max(launches) == steps and 1 < sum(s > 1 for s in launches)
    assert core.scheduler.stats.retractions > 0
    assert core.scheduler.stats.generation_tokens == sum(len(done[r.rid].output_ids) for r in reqs)
    core.mm.cache.flush(core.mm)
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    core.shutdown()


def test_sampling_penalties_and_logprobs_match_single_steps(tiny64):
    """Seeded sampling with penalties, min_new_tokens holding EOS back, logprobs and top logprobs: a launch of
    several steps advances each request's sampler as single steps do."""
    params = [
        {"max_new_tokens": 17, "temperature": 0.8, "top_p": 0.9, "seed": 7, "frequency_penalty": 0.5},
        {"max_new_tokens": 13, "temperature": 1.2, "top_k": 20, "seed": 8, "presence_penalty": 0.3, "min_new_tokens": 6},
        {"max_new_tokens": 11, "temperature": 0, "repetition_penalty": 1.3},
        {"max_new_tokens": 9, "temperature": 0.7, "min_p": 0.05, "seed": 9},
    ]
    runs = []
    for steps in (1, 4):
        core = make_core(tiny64, num_continuous_decode_steps=steps, disable_radix_cache=True)
        launches = _launches(core)
        # the first request asks for logprobs and the top 3
        reqs = [core.make_request(p, dict(q), return_logprob=i == 0, top_logprobs_num=3 * (i == 0))
                for i, (p, q) in enumerate(zip(PROMPTS, params))]
        done = drive(core, reqs, seed=1)
        runs.append([(done[r.rid].output_ids, done[r.rid].output_logprobs, done[r.rid].output_top_logprobs,
                      done[r.rid].finish_reason) for r in reqs])
        assert (max(launches) > 1) == (steps > 1)
        core.shutdown()
    for one, launched in zip(*runs):
        assert one[0] == launched[0] and one[3] == launched[3]  # tokens and finish
        # logprobs: float64 values of batches that need not be the same size in the two runs
        assert one[1] == pytest.approx(launched[1], rel=1e-9, abs=1e-12)
        for a, b in zip(one[2], launched[2]):
            assert [t for t, _ in a] == [t for t, _ in b] and [v for _, v in a] == pytest.approx([v for _, v in b])
    assert len(runs[0][0][1]) == 17 and len(runs[0][0][2]) == 17
    # requests batched with one that asks for logprobs keep none (the batch computes them for every row)
    assert all(not lps and not tops for run in runs for _, lps, tops, _ in run[1:])


def test_decode_steps_argument_checks():
    with pytest.raises(ValueError, match="num-continuous-decode-steps"):
        ServerArgs(num_continuous_decode_steps=0)
    with pytest.raises(ValueError, match="speculative-launch-steps"):
        ServerArgs(num_continuous_decode_steps=4, speculative_algorithm="dspark")


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_inside_a_launch(tiny64, overlap):
    """A request aborted while a launch of several steps holds it keeps only tokens of the reference (none after
    the abort), its memory comes back once the launch is processed, and the others finish exactly."""
    core = make_core(tiny64, num_continuous_decode_steps=6, disable_overlap_schedule=not overlap,
                     disable_radix_cache=True)
    params = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    reqs = [core.make_request(p, params) for p in PROMPTS[:3]]
    for r in reqs:
        core.add_request(r)
    victim = reqs[1]
    while len(victim.output_ids) < 2 or (overlap and core.scheduler.inflight is None):
        core.step()
    assert victim.inflight or not overlap  # (with overlap, a launch holding it is in flight now)
    kept = len(victim.output_ids)
    assert core.abort(victim.rid)
    while core.has_work():
        core.step()
    assert victim.finish_reason["type"] == "abort" and victim.output_ids == greedy_reference(tiny64, victim.prompt_ids, kept)
    for r in (reqs[0], reqs[2]):
        assert r.output_ids == greedy_reference(tiny64, r.prompt_ids, 20)
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    core.shutdown()
