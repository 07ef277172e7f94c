"""Prefix caching for a state that overwrites itself: hit == cold, token for token (float64, greedy)."""

import random

import pytest

from tests.engine.helpers import drive, greedy_reference, make_core, random_prompts

G = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
BASE = random_prompts(1, seed=5, lo=200, hi=200)[0]


def run_one(core, prompt, params=G):
    r = core.make_request(prompt, params)
    drive(core, [r])
    return r


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_hit_equals_cold_at_every_prefix_length(tiny64, page_size, overlap):
    core = make_core(tiny64, page_size=page_size, disable_overlap_schedule=not overlap, chunked_prefill_size=64)
    first = run_one(core, BASE)
    assert first.output_ids == greedy_reference(tiny64, BASE, 6)
    cached = {}
    for shared in [1, 63, 64, 65, 127, 128, 129]:
        prompt = BASE[:shared] + random_prompts(1, seed=shared, lo=20, hi=20)[0]
        r = run_one(core, prompt)
        assert r.output_ids == greedy_reference(tiny64, prompt, 6), f"shared prefix {shared}"
        cached[shared] = r.cached_tokens
    # reuse stops at the deepest checkpoint: chunk boundaries of the first prompt (64, 128, 192)
    assert cached == {1: 0, 63: 0, 64: 64, 65: 64, 127: 64, 128: 128, 129: 128}
    for prompt in (BASE, BASE[:-1], BASE[:128], BASE[:129]):
        r = run_one(core, prompt)
        assert r.output_ids == greedy_reference(tiny64, prompt, 6), f"repeat of {len(prompt)} tokens"
        # identical repeats hit at least 1 - chunk / len; a prompt ending on the grid backs off one chunk
        assert r.cached_tokens >= len(prompt) - 64 and r.cached_tokens < len(prompt)
    core.shutdown()


@pytest.mark.parametrize("overlap", [False, True])
def test_branch_point_resumes_without_replay(tiny64, overlap):
    core = make_core(tiny64, page_size=16, disable_overlap_schedule=not overlap, chunked_prefill_size=4096)
    system = BASE[:100]
    tails = random_prompts(3, seed=9, lo=50, hi=50)
    a = run_one(core, system + tails[0])  # one chunk: its only checkpoint lands at 128, past the fork
    stats = core.mm.cache.stats
    before = stats.replayed_tokens
    b = run_one(core, system + tails[1])  # leaves the tree mid-edge at 100: replays, checkpoints the fork (64)
    assert b.cached_tokens == 0 and stats.replayed_tokens - before == 96
    before = stats.replayed_tokens
    c = run_one(core, system + tails[2])
    # the second branch resumes exactly at the chunk-aligned fork: nothing before it is recomputed
    assert c.cached_tokens == 64
    assert stats.replayed_tokens - before == 96 - 64
    for r, t in zip((a, b, c), tails):
        assert r.output_ids == greedy_reference(tiny64, system + t, 6)
    core.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_multi_turn_chat(tiny64, page_size):
    core = make_core(tiny64, page_size=page_size, chunked_prefill_size=48, state_track_interval=64)
    history = BASE[:70]
    params = {**G, "max_new_tokens": 40}
    for turn in range(4):
        history = history + random_prompts(1, seed=100 + turn, lo=15, hi=30)[0]
        r = run_one(core, history, params)
        assert r.output_ids == greedy_reference(tiny64, history, 40), f"turn {turn}"
        if turn:
            # the previous turn's prompt and most of its answer come from the cache
            assert r.cached_tokens >= prev_len - 64
        history = history + r.output_ids
        prev_len = len(history)
    core.shutdown()


@pytest.mark.parametrize("page_size,overlap", [(1, True), (16, False), (16, True)])
def test_eviction_storm_stays_exact(tiny64, page_size, overlap):
    """Tiny pools, many requests over a few shared prefixes: constant eviction, retraction, restores."""
    core = make_core(tiny64, page_size=page_size, disable_overlap_schedule=not overlap, chunked_prefill_size=40,
                     max_total_tokens=400, max_state_slots=10, max_running_requests=3)
    rng = random.Random(page_size)
    stems = [BASE[:n] for n in (70, 130, 150)]
    prompts = [rng.choice(stems)[: rng.randint(60, 150)] + random_prompts(1, seed=i, lo=1, hi=30)[0]
               for i in range(24)]
    reqs = [core.make_request(p, {**G, "max_new_tokens": rng.randint(3, 12)}) for p in prompts]
    done = drive(core, reqs, seed=page_size)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, r.params.max_new_tokens)
    stats = core.mm.cache.stats
    assert stats.checkpoints_evicted > 0 and stats.pages_evicted > 0 and stats.reused_tokens > 0
    core.mm.cache.flush(core.mm)
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    core.shutdown()


def test_restore_of_an_unwritten_slot_fails_loudly(tiny64):
    """The poison is real: restoring from a freed (NaN) slot turns the output to garbage, not silence."""
    core = make_core(tiny64, page_size=16)
    run_one(core, BASE)
    ckpt = next(n for n in core.mm.cache._nodes() if n.state is not None)
    core.mm.state.poison(ckpt.state)
    r = run_one(core, BASE[: ckpt.depth] + [7] * 5)
    assert r.cached_tokens == ckpt.depth
    assert r.output_ids != greedy_reference(tiny64, BASE[: ckpt.depth] + [7] * 5, 6)
    core.shutdown()


def test_disable_radix_cache_matches_nothing(tiny64):
    core = make_core(tiny64, disable_radix_cache=True)
    run_one(core, BASE)
    assert run_one(core, BASE).cached_tokens == 0
    core.shutdown()


@pytest.mark.parametrize("chunk,page_size,overlap", [(7, 1, True), (64, 16, False), (64, 1, True), (4096, 16, True)])
def test_batching_with_cache_and_retraction_is_exact(tiny64, chunk, page_size, overlap):
    rng = random.Random(chunk)
    prompts = [BASE[: rng.choice([0, 64, 100, 130])] + p for p in random_prompts(32, seed=chunk, lo=1, hi=60)]
    core = make_core(tiny64, page_size=page_size, chunked_prefill_size=chunk, disable_overlap_schedule=not overlap,
                     max_total_tokens=240)
    reqs = [core.make_request(p, {**G, "max_new_tokens": 8}) for p in prompts]
    done = drive(core, reqs, seed=chunk)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 8)
    assert core.scheduler.stats.retractions > 0 and core.scheduler.stats.cached_tokens > 0
    core.shutdown()
