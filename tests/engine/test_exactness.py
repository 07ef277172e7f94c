"""The exactness contract for batching: every request's greedy tokens equal the single-request reference."""

import pytest
import torch

from tests.engine.helpers import drive, greedy_reference, make_core, random_prompts

PROMPTS = random_prompts(32, seed=1)
NEW = 12


@pytest.mark.parametrize("chunk", [7, 64, 4096])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_batching_is_exact(tiny64, chunk, page_size, overlap):
    # a pool far smaller than the 32 requests need, so retraction must happen
    core = make_core(tiny64, chunked_prefill_size=chunk, page_size=page_size, max_total_tokens=160,
                     disable_overlap_schedule=not overlap, disable_radix_cache=True)
    reqs = [core.make_request(p, {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}) for p in PROMPTS]
    done = drive(core, reqs, seed=chunk + page_size)
    for r, p in zip(reqs, PROMPTS):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, NEW), f"request with a {len(p)}-token prompt"
        assert done[r.rid].finish_reason == {"type": "length", "length": NEW}
    assert core.scheduler.stats.retractions > 0
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    core.shutdown()


def test_admission_cap_lowered_at_run_time(tiny64):
    """scheduler.max_running (a benchmark sweeping batch sizes on one engine) caps the running batch below
    --max-running-requests; outputs stay exact and every request finishes."""
    core = make_core(tiny64, max_running_requests=8)
    core.scheduler.max_running = 2
    prompts = random_prompts(5, seed=11, lo=3, hi=20)
    reqs = [core.make_request(p, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}) for p in prompts]
    for r in reqs:
        core.add_request(r)
    peak = 0
    while core.has_work():
        core.step()
        peak = max(peak, len(core.scheduler.running))
    assert peak == 2
    for r, p in zip(reqs, prompts):
        assert r.output_ids == greedy_reference(tiny64, p, 6)
    core.shutdown()


def test_cpu_single_request_runs_on_the_scheduler_thread(tiny64):
    """With overlap on, a CPU batch of one request runs synchronously (nothing in flight after the step, one token
    per step); two requests use the forward thread (a batch in flight after the step). Output stays exact."""
    core = make_core(tiny64, disable_overlap_schedule=False, disable_radix_cache=True)
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    one = core.make_request([5, 6, 7, 8], params)
    core.add_request(one)
    while core.has_work():
        core.step()
        assert core.scheduler.inflight is None
    assert one.output_ids == greedy_reference(tiny64, [5, 6, 7, 8], 6)
    assert _run_counting_inflight(core, tiny64, ([9, 10, 11], [12, 13])) > 0
    core.shutdown()


def _run_counting_inflight(core, model, prompts) -> int:
    """Run greedy requests for prompts to the end, checking each against the reference; returns how many steps
    left a batch in flight (results processed a step later: the overlap's order)."""
    reqs = [core.make_request(p, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}) for p in prompts]
    for r in reqs:
        core.add_request(r)
    inflight = 0
    while core.has_work():
        core.step()
        inflight += core.scheduler.inflight is not None
    assert [r.output_ids for r in reqs] == [greedy_reference(model, p, 6) for p in prompts]
    return inflight


def test_cpu_with_several_threads_overlaps_on_the_scheduler_thread(tiny64):
    """With torch computing on several threads, a CPU engine starts no forward thread (a second OpenMP team would
    throttle both teams' spin-waits): overlapped batches run on the scheduler thread, outputs exact."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        core = make_core(tiny64, disable_overlap_schedule=False, disable_radix_cache=True)
    finally:
        torch.set_num_threads(threads)
    assert core.scheduler.overlap and core.scheduler.forward is None
    assert _run_counting_inflight(core, tiny64, ([9, 10, 11], [12, 13], [14, 15, 16, 17])) > 0
    core.shutdown()
