"""Unified memory: one byte pool, states from the bottom, KV pages from the top, free space kept contiguous."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel.mem.pools import OutOfMemory
from kestrel.mem.unified import UnifiedMemory
from kestrel.models.presets import preset_config
from tests.engine.helpers import drive, greedy_reference, make_core, random_prompts
from tests.mem.test_radix_cache import BASE, G

CFG = preset_config("k3-tiny")


def fill(mem: UnifiedMemory, kind: str, lid: int, value: float) -> None:
    """Write a recognisable pattern into a live block through the model's views."""
    if kind == "slot":
        pos = mem.slot_phys(lid)
        for l in CFG.kda_layer_ids:
            mem.ssm_state(l)[pos].fill_(value)
            mem.conv_state(l)[pos].fill_(value + 0.5)
    else:
        pos = mem.page_phys([lid])[0]
        for l in CFG.mla_layer_ids:
            mem.kv_buffer(l)[pos].fill_(value)


def read(mem: UnifiedMemory, kind: str, lid: int) -> set[float]:
    if kind == "slot":
        pos = mem.slot_phys(lid)
        vals = {float(mem.ssm_state(l)[pos].unique().item()) for l in CFG.kda_layer_ids}
        vals |= {float(mem.conv_state(l)[pos].unique().item()) - 0.5 for l in CFG.kda_layer_ids}
        return vals
    pos = mem.page_phys([lid])[0]
    return {float(mem.kv_buffer(l)[pos].unique().item()) for l in CFG.mla_layer_ids}


ops = st.lists(st.tuples(st.sampled_from(["alloc_slot", "alloc_page", "free_slot", "free_page", "pin", "unpin"]),
                         st.integers(0, 10 ** 6)), max_size=120)


@settings(max_examples=60, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 4]))
def test_random_alloc_free_compact_keeps_invariants_and_contents(ops, page_size):
    mem = UnifiedMemory(CFG, 200_000, page_size, torch.float32, "cpu")
    pool = mem.pool
    live = {"slot": {}, "page": {}}
    pins = set()
    counter = 0
    for op, r in ops:
        kind = "slot" if "slot" in op else "page"
        if op.startswith("alloc"):
            try:
                lid = mem.alloc_slot() if kind == "slot" else mem.alloc_pages(1)[0]
            except OutOfMemory:
                assert pool.free_bytes < (pool.slot_bytes if kind == "slot" else pool.page_bytes)
                assert not pool.holes[kind]
                continue
            counter += 1
            fill(mem, kind, lid, float(counter))
            live[kind][lid] = float(counter)
        elif op.startswith("free") and live[kind]:
            lid = sorted(live[kind])[r % len(live[kind])]
            if (kind, lid) in pins:
                continue
            ops_ = mem.free_slot(lid)[0] if kind == "slot" else mem.free_pages([lid])
            for o in ops_:  # the moves, as the forward stream would run them
                mem.run(o)
            del live[kind][lid]
        elif op == "pin":
            choices = [(k, l) for k in live for l in live[k] if (k, l) not in pins]
            if choices:
                k, l = choices[r % len(choices)]
                pool.pin(k, l)
                pins.add((k, l))
        elif op == "unpin" and pins:
            k, l = sorted(pins)[r % len(pins)]
            pool.unpin(k, l)
            pins.discard((k, l))
            for o in pool.take_ops():
                mem.run(o)
        mem.check()
        # every live block reachable exactly once, holding what was written into it
        for kind in live:
            assert set(pool.sides[kind].table) == set(live[kind])
            for lid, value in live[kind].items():
                assert read(mem, kind, lid) == {value}
        # with nothing pinned the free bytes form one contiguous region
        if not pins:
            assert not pool.holes["slot"] and not pool.holes["page"]
            used = (pool.n_state - 1) * pool.slot_bytes + (pool.n_kv - 1) * pool.page_bytes
            assert pool.free_bytes == pool.total - pool.slot_bytes - pool.page_bytes - used


def test_either_side_takes_the_whole_free_region():
    mem = UnifiedMemory(CFG, 300_000, 4, torch.float32, "cpu")
    pool = mem.pool
    slots = [mem.alloc_slot() for _ in range(pool.num_free("slot"))]
    assert pool.free_bytes < pool.slot_bytes and pool.num_free("slot") == 0
    for s in slots:
        mem.free_slot(s)
    pages = mem.alloc_pages(pool.num_free("page"))
    assert len(pages) > len(slots) and pool.num_free("slot") == 0


@pytest.mark.parametrize("page_size,overlap,tokens,chunk", [(1, True, 112, 48), (16, False, 80, 16)])
def test_engine_is_exact_with_unified_memory(tiny64, page_size, overlap, tokens, chunk):
    prompts = [BASE[:n] + p for n, p in zip([0, 64, 100, 130] * 6, random_prompts(24, seed=page_size, lo=1, hi=50))]
    core = make_core(tiny64, page_size=page_size, chunked_prefill_size=chunk, disable_overlap_schedule=not overlap,
                     enable_unified_memory=True, max_total_tokens=tokens, max_state_slots=10)
    reqs = [core.make_request(p, {**G, "max_new_tokens": 8}) for p in prompts]
    done = drive(core, reqs, seed=page_size)
    for r, p in zip(reqs, prompts):
        assert done[r.rid].output_ids == greedy_reference(tiny64, p, 8)
    stats = core.scheduler.stats
    assert stats.cached_tokens > 0 and stats.retractions > 0
    # the same pool held states and pages at different times, and compaction moved blocks
    core.mm.cache.flush(core.mm)
    assert core.mm.mem.pool.n_state == 1 and core.mm.mem.pool.n_kv == 1
    core.shutdown()


def test_prefix_hit_equals_cold_with_unified_memory(tiny64):
    core = make_core(tiny64, page_size=16, chunked_prefill_size=64, enable_unified_memory=True)
    first = core.make_request(BASE, G)
    drive(core, [first])
    for shared in (64, 65, 129):
        prompt = BASE[:shared] + random_prompts(1, seed=shared, lo=20, hi=20)[0]
        r = core.make_request(prompt, G)
        drive(core, [r])
        assert r.output_ids == greedy_reference(tiny64, prompt, 6) and r.cached_tokens == shared // 64 * 64
    core.shutdown()
