"""SGLang's native /generate: the offline Engine's output dicts, whole or streamed (cumulative), over HTTP."""

import json

import httpx
import pytest

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_new_tokens": 10}


def _strip(out: dict) -> dict:
    meta = {k: v for k, v in out["meta_info"].items() if k not in ("id", "e2e_latency")}
    return {**out, "meta_info": meta}


def test_generate_equals_offline_engine(server, engine):
    for body, want in (({"text": "def main():", "sampling_params": GREEDY},
                        engine.generate("def main():", GREEDY)),
                       ({"input_ids": [[1, 50, 60], [1, 70]], "sampling_params": GREEDY, "return_logprob": True,
                         "top_logprobs_num": 2},
                        engine.generate(input_ids=[[1, 50, 60], [1, 70]], sampling_params=GREEDY,
                                        return_logprob=True, top_logprobs_num=2))):
        got = httpx.post(server.url + "/generate", json=body, timeout=60).json()
        if isinstance(want, list):
            assert [_strip(g) for g in got] == json.loads(json.dumps([_strip(w) for w in want]))
        else:
            assert _strip(got) == _strip(want)


def test_generate_stream_is_cumulative(server):
    body = {"text": "for i in range(10):", "sampling_params": {**GREEDY, "max_new_tokens": 16}}
    whole = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) > 1
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"] and b["text"].startswith(a["text"])
    assert _strip(chunks[-1]) == _strip(whole)
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
