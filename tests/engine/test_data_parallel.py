"""--dp-size: replicas as core processes behind the offline Engine (the server's channel, kestrel.server.engine_client),
against the one-process engine on the same requests."""

import os

import pytest

from kestrel import Engine
from kestrel.config import ServerArgs
from kestrel.engine.core import merge_metrics
from kestrel.engine.sampling_params import InvalidRequest
from kestrel.server.engine_client import EngineClient
from kestrel.server.engine_proc import place_replica

TINY = dict(skip_tokenizer_init=True, dtype="float64", context_length=256)
GREEDY = {"max_new_tokens": 6, "temperature": 0}


def test_replicas_split_the_threads_or_take_one_gpu_each():
    cpu = ServerArgs(dp_size=2, device="cpu")
    assert place_replica(cpu, 1, threads=2, gpus=0) == (cpu, 1)
    assert place_replica(ServerArgs(dp_size=3), 0, threads=2, gpus=0)[1] == 1  # at least one each
    assert place_replica(ServerArgs(dp_size=2), 1, threads=8, gpus=0)[0].device == "cpu"
    assert place_replica(ServerArgs(), 0, threads=8, gpus=0)[1] == 8  # one replica: left alone
    assert place_replica(ServerArgs(dp_size=2), 1, threads=16, gpus=2) == (ServerArgs(dp_size=2, device="cuda:1"), 16)
    assert place_replica(ServerArgs(dp_size=2, device="cuda:2"), 1, threads=16, gpus=4)[0].device == "cuda:3"
    with pytest.raises(ValueError, match="needs GPUs 1..2; this host has 2"):
        place_replica(ServerArgs(dp_size=2, device="cuda:1"), 0, threads=16, gpus=2)
    with pytest.raises(ValueError, match="dp-size"):
        ServerArgs(dp_size=0)
    with pytest.raises(ValueError, match="load-balance-method"):
        ServerArgs(load_balance_method="random")


def test_merged_metrics_sum_counts_and_recompute_ratios():
    a = dict(generation_tokens_total=5, kv_pages_used=1, kv_pages_total=10, state_slots_used=3, state_slots_total=4,
             kv_usage=0.1, state_usage=0.75, page_size=16, spec_verify_steps_total=2, spec_accepted_tokens_total=4,
             spec_accept_length=3.0)
    b = dict(a, generation_tokens_total=7, kv_pages_used=9, state_slots_used=1, spec_verify_steps_total=6,
             spec_accepted_tokens_total=2, spec_accept_length=4 / 3)
    m = merge_metrics([a, b])
    assert m["generation_tokens_total"] == 12 and m["page_size"] == 16
    assert m["kv_usage"] == 0.5 and m["state_usage"] == 0.5
    assert m["spec_accept_length"] == (6 + 8) / 8
    assert merge_metrics([a]) == a


def test_requests_are_spread_round_robin_or_to_the_shortest_queue():
    for method, loads, want in (("round_robin", [5, 0, 0], [0, 1, 2, 0]), ("shortest_queue", [2, 0, 1], [1, 1, 2, 0])):
        client = EngineClient(ServerArgs(dp_size=3, load_balance_method=method))
        try:
            client.load = list(loads)
            got = []
            for _ in range(4):
                got.append(client._pick())
                client.load[got[-1]] += 1
            assert got == want, method
        finally:
            for sock in (*client.to_cores, client.from_core):
                sock.close(linger=0)
            client.ctx.term()


@pytest.fixture(scope="module")
def one_process():
    with Engine("k3-tiny", **TINY) as e:
        yield e


@pytest.mark.parametrize("method", ["round_robin", "shortest_queue"])
def test_two_replicas_give_the_one_process_engines_tokens(one_process, method):
    prompts = [[5 + i, 7, 9 + i, 11] * (i + 1) for i in range(6)]
    want = one_process.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
    with Engine("k3-tiny", **TINY, dp_size=2, load_balance_method=method) as dp:
        info = dp.replicas.client.replica_info
        assert [i["dp_rank"] for i in info] == [0, 1] and {i["device"] for i in info} == {"cpu"}
        if "OMP_NUM_THREADS" in os.environ:  # each replica gets its share of the threads
            assert [i["threads"] for i in info] == [max(1, int(os.environ["OMP_NUM_THREADS"]) // 2)] * 2
        got = dp.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
        assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
        for g, w in zip(got, want):
            assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
            lp = [[x[0] for x in o["meta_info"]["output_token_logprobs"]] for o in (g, w)]
            assert lp[0] == pytest.approx(lp[1], abs=1e-9)
        # streamed: cumulative, growing, ending where the whole response ends (tokens that arrive together while
        # the consumer is busy come in one chunk: a loaded machine gives fewer than one chunk a token)
        chunks = list(dp.generate(input_ids=prompts[2], sampling_params=GREEDY, stream=True))
        lens = [len(c["output_ids"]) for c in chunks]
        assert len(chunks) > 1 and lens == sorted(set(lens)) and chunks[-1]["output_ids"] == want[2]["output_ids"]
        assert all(c["output_ids"] == want[2]["output_ids"][: len(c["output_ids"])] for c in chunks)
        # a bad request is refused by the replica that got it, by name, and both keep serving
        with pytest.raises(InvalidRequest, match="token id 99999 is outside the vocabulary"):
            dp.generate(input_ids=[[5, 6], [5, 99999]], sampling_params=GREEDY)
        again = dp.generate(input_ids=prompts[:2], sampling_params=GREEDY)
        assert [g["output_ids"] for g in again] == [w["output_ids"] for w in want[:2]]
        m = dp.metrics()
        # the refused request's partner was aborted, maybe after its first tokens
        assert 6 * (6 + 1 + 2) <= m["generation_tokens_total"] <= 6 * (6 + 1 + 2 + 1)
        assert m["num_running_reqs"] == 0 and m["kv_pages_used"] == m["kv_pages_cached"]
        assert m["state_slots_total"] == 2 * one_process.metrics()["state_slots_total"]


def test_unseeded_choices_on_different_replicas_draw_different_seeds():
    # n = 2 without a seed: the two choices go to the two replicas, which must not share their seed streams
    with Engine("k3-tiny", **TINY, dp_size=2) as dp:
        outs = dp.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 8, "temperature": 1.0, "n": 2})
    assert outs[0]["output_ids"] != outs[1]["output_ids"]
