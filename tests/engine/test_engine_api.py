import pytest
import torch

from kestrel import Engine
from kestrel.engine.sampling_params import InvalidRequest
from tests.engine.helpers import drive, greedy_reference, make_core

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    with Engine("k3-tiny", dtype="float64", skip_tokenizer_init=True, disable_radix_cache=True,
                context_length=256) as e:
        yield e


def test_generate_shapes_and_meta(engine, tiny64):
    prompt = list(range(5, 25))
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6})
    assert out["output_ids"] == greedy_reference(tiny64, prompt, 6)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 20 and meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6} and meta["cached_tokens"] == 0
    outs = engine.generate(input_ids=[prompt, prompt[:7]], sampling_params={**GREEDY, "max_new_tokens": 3})
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[1]["output_ids"] == greedy_reference(tiny64, prompt[:7], 3)


def test_logprobs_are_the_models(engine, tiny64):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 4}, return_logprob=True,
                          top_logprobs_num=3)
    seq = list(prompt)
    for (lp, tok, _), top in zip(out["meta_info"]["output_token_logprobs"], out["meta_info"]["output_top_logprobs"]):
        ref = torch.log_softmax(tiny64.reference_logits(seq)[-1], -1)
        assert abs(lp - ref[tok].item()) < 1e-10
        assert [t for _, t, _ in top] == ref.topk(3).indices.tolist()
        seq.append(tok)


def test_stop_token_ids_eos_and_min_new_tokens(engine, tiny64):
    prompt = list(range(30, 50))
    ref = greedy_reference(tiny64, prompt, 10)
    stop = ref[4]
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 10, "stop_token_ids": [stop]})
    first = ref.index(stop)
    assert out["output_ids"] == ref[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    # EOS comes from the model config (eos_token_id = 2 for k3-tiny); ignore_eos turns it off
    eng_eos = engine.core.eos_ids
    assert 2 in eng_eos


def test_n_and_seeds(engine):
    outs = engine.generate(input_ids=[7, 8, 9], sampling_params={"max_new_tokens": 8, "n": 4, "seed": 5,
                                                                 "ignore_eos": True})
    assert len(outs) == 4 and len({tuple(o["output_ids"]) for o in outs}) > 1
    again = engine.generate(input_ids=[7, 8, 9], sampling_params={"max_new_tokens": 8, "n": 4, "seed": 5,
                                                                  "ignore_eos": True})
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in again]


def test_streaming_yields_growing_outputs(engine, tiny64):
    prompt = list(range(60, 70))
    chunks = list(engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 5}, stream=True))
    # cumulative and growing; tokens that arrive together while the consumer is busy come in one chunk
    lens = [len(c["output_ids"]) for c in chunks]
    want = greedy_reference(tiny64, prompt, 5)
    assert len(chunks) > 1 and lens == sorted(set(lens)) and chunks[-1]["output_ids"] == want
    assert all(c["output_ids"] == want[: len(c["output_ids"])] for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("kwargs,pattern", [
    ({"input_ids": []}, "empty"),
    ({"input_ids": [1, 2, 5000]}, "5000"),
    ({"input_ids": [1] * 300}, "context length"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -3}}, "max_new_tokens"),
    ({"input_ids": [1, 2], "sampling_params": {"nope": 1}}, "nope"),
    ({"prompt": "hi"}, "tokenizer"),
])
def test_bad_input_is_refused_and_serving_goes_on(engine, tiny64, kwargs, pattern):
    with pytest.raises(InvalidRequest, match=pattern):
        engine.generate(**kwargs)
    out = engine.generate(input_ids=[9, 9, 9], sampling_params={**GREEDY, "max_new_tokens": 2})
    assert out["output_ids"] == greedy_reference(tiny64, [9, 9, 9], 2)


def test_abort_frees_memory_and_spares_the_others(tiny64):
    core = make_core(tiny64, disable_radix_cache=True)
    a = core.make_request(list(range(40)), {**GREEDY, "max_new_tokens": 50})
    b = core.make_request(list(range(10, 30)), {**GREEDY, "max_new_tokens": 8})
    core.add_request(a)
    core.add_request(b)
    for _ in range(4):
        core.step()
    assert core.abort(a.rid)
    done = drive(core, [])
    assert a.finish_reason == {"type": "abort"} and len(a.output_ids) < 50
    assert b.output_ids == greedy_reference(tiny64, list(range(10, 30)), 8)
    assert core.mm.num_free_pages == core.mm.kv.pages.capacity
    assert core.mm.num_free_slots == core.mm.state.slots.capacity
    assert not core.abort("no-such-request")
    core.shutdown()


def test_max_new_tokens_zero_and_context_clip(tiny64):
    core = make_core(tiny64, disable_radix_cache=True, context_length=40)
    z = core.make_request([1, 2, 3], {"max_new_tokens": 0})
    c = core.make_request(list(range(35)), {**GREEDY, "max_new_tokens": 100})
    done = drive(core, [z, c])
    assert done[z.rid].output_ids == [] and done[z.rid].finish_reason["type"] == "length"
    assert len(done[c.rid].output_ids) == 5  # the context length caps prompt + output at 40
    core.shutdown()


def test_metrics(engine):
    engine.generate(input_ids=[1, 2, 3, 4], sampling_params={**GREEDY, "max_new_tokens": 3})
    m = engine.metrics()
    assert m["generation_tokens_total"] >= 3 and m["num_running_reqs"] == 0 and m["kv_pages_used"] == 0
    assert "spec_accept_length" not in m  # speculative counters only when speculating


def test_a_request_larger_than_the_pool_is_refused_not_hung(tiny64):
    core = make_core(tiny64, disable_radix_cache=True, max_total_tokens=32, chunked_prefill_size=4096)
    big = core.make_request(list(range(100)), {**GREEDY, "max_new_tokens": 4})
    small = core.make_request(list(range(10)), {**GREEDY, "max_new_tokens": 4})
    done = drive(core, [big, small])
    assert done[big.rid].finish_reason["type"] == "abort" and "KV pages" in done[big.rid].finish_reason["message"]
    assert done[small.rid].output_ids == greedy_reference(tiny64, list(range(10)), 4)
    core.shutdown()


@pytest.mark.parametrize("unified", [False, True])
def test_shutdown_gives_the_pools_back(unified):
    """After shutdown the engine holds no pool memory (on a GPU the next engine sizes its pools from what is free),
    its counters stay readable, and a new engine in the same process serves."""
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with Engine("k3-tiny", dtype="float32", skip_tokenizer_init=True, enable_unified_memory=unified) as first:
        before = first.core.runner.mem.device_bytes()
        out = first.generate(input_ids=[5, 6, 7], sampling_params=params)["output_ids"]
    assert before > 0 and first.core.runner.mem.device_bytes() == 0
    assert first.metrics()["num_running_reqs"] == 0
    with Engine("k3-tiny", dtype="float32", skip_tokenizer_init=True, enable_unified_memory=unified) as second:
        assert second.generate(input_ids=[5, 6, 7], sampling_params=params)["output_ids"] == out


def test_pdl_flag_reaches_the_kernels(tiny64, monkeypatch):
    """Programmatic dependent launch is set process-wide at start-up (before any graph capture): on by default,
    off with --disable-pdl; CPU tensors never launch with it."""
    import kestrel.ops as ops

    monkeypatch.setattr(ops, "PDL", False)
    core = make_core(tiny64)
    assert ops.PDL is True and not ops.pdl(torch.zeros(1))
    core.shutdown()
    core = make_core(tiny64, disable_pdl=True)
    assert ops.PDL is False
    core.shutdown()


def test_start_up_collects_and_freezes_the_heap(tiny64):
    """An engine's start collects the garbage of earlier engines (cycles included) and freezes what is alive, so
    no collection in a step walks the model or frees an old engine; shutdown unfreezes."""
    import gc
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(a)
    del a, b
    gc.disable()  # no collection between here and the engine's own
    try:
        assert gone() is not None
        core = make_core(tiny64)
        assert gone() is None and gc.get_freeze_count() > 0
        params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
        done = drive(core, [core.make_request([5, 6, 7], params)])
        assert len(next(iter(done.values())).output_ids) == 3
        core.shutdown()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
