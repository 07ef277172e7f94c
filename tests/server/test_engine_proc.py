"""The core process loop without the process: acks, refusals, incremental updates every stream_interval tokens
(first token at once), non-streaming requests reported at their first token and finish, aborts."""

import pickle

import pytest

from kestrel.config import ServerArgs
from kestrel.engine.core import EngineCore
from kestrel.engine.sampling_params import SamplingParams
from kestrel.server.engine_proc import CoreLoop


class Outbox:
    def __init__(self):
        self.msgs = []

    def send(self, data, *a, **kw):
        self.msgs.append(pickle.loads(data))

    def take(self, kind):
        got = [m for m in self.msgs if m[0] == kind]
        self.msgs = [m for m in self.msgs if m[0] != kind]
        return got


@pytest.fixture(scope="module")
def core():
    c = EngineCore(ServerArgs(model_path="k3-tiny", dtype="float32", skip_tokenizer_init=True, stream_interval=3,
                              context_length=256))
    yield c
    c.shutdown()


def run(loop: CoreLoop, out: Outbox) -> dict[str, list]:
    """Step until idle; rid -> its updates in order."""
    while loop.core.has_work():
        loop._step()
    updates = {}
    for _, batch in out.take("out"):
        for u in batch:
            updates.setdefault(u.rid, []).append(u)
    return updates


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def test_updates_ack_and_refusals(core):
    out = Outbox()
    loop = CoreLoop(core, None, out, parent_pid=0)
    loop._on_add("s", [1, 2, 3], greedy(10), False, 0, True)
    loop._on_add("w", [4, 5], greedy(10), True, 2, False)
    loop._on_add("bad", [1, 99999], greedy(3), False, 0, True)
    loop._on_add("long", list(range(300)), greedy(3), False, 0, True)
    acks = {rid: err for _, rid, err in out.take("ack")}
    assert acks["s"] is None and acks["w"] is None
    assert "outside the vocabulary" in acks["bad"] and "context length" in acks["long"]
    ups = run(loop, out)
    assert set(ups) == {"s", "w"}
    # streaming: the first token at once, then every 3 tokens, the rest with the finish
    assert [len(u.new_ids) for u in ups["s"]] == [1, 3, 3, 3]
    # not streaming: the first token (time to first token), then everything at the finish
    assert [len(u.new_ids) for u in ups["w"]] == [1, 9]
    for updates in ups.values():
        assert [u.finish_reason for u in updates[:-1]] == [None] * (len(updates) - 1)
        assert updates[-1].finish_reason == {"type": "length", "length": 10}
    w = ups["w"]
    assert sum(len(u.new_logprobs) for u in w) == 10 and all(len(t) == 2 for u in w for t in u.new_top_logprobs)
    assert not loop.sent and not loop.interval


def test_abort_and_metrics(core):
    out = Outbox()
    loop = CoreLoop(core, None, out, parent_pid=0)
    loop._on_add("a", [7, 8, 9], greedy(200), False, 0, True)
    loop._step()
    loop._step()
    loop._on_abort("a")
    loop._on_abort("unknown")
    ups = run(loop, out)
    assert ups["a"][-1].finish_reason["type"] == "abort"
    loop._on_metrics("t")
    (_, token, m), = out.take("metrics")
    assert token == "t" and m["num_running_reqs"] == 0 and m["kv_pages_used"] == m["kv_pages_cached"]
    loop._on_shutdown()
    assert not loop.running
