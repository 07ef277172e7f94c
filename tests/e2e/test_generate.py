"""SGLang's native /generate: the offline Engine's output dicts, whole or streamed (cumulative), over HTTP."""

import json

import httpx
import pytest

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_new_tokens": 10}


def _strip(out: dict) -> dict:
    meta = {k: v for k, v in out["meta_info"].items() if k not in ("id", "e2e_latency")}
    return {**out, "meta_info": meta}


def _same(got, want, path="") -> None:
    """Equal structures, tokens and text exactly; logprobs to 1e-4 (the server may batch a request with others,
    an fp32 GEMM over another batch rounds otherwise)."""
    if isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4), path
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for k in want:
            _same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


def test_generate_equals_offline_engine(server, engine):
    for body, want in (({"text": "def main():", "sampling_params": GREEDY},
                        engine.generate("def main():", GREEDY)),
                       ({"input_ids": [[1, 50, 60], [1, 70]], "sampling_params": GREEDY, "return_logprob": True,
                         "top_logprobs_num": 2},
                        engine.generate(input_ids=[[1, 50, 60], [1, 70]], sampling_params=GREEDY,
                                        return_logprob=True, top_logprobs_num=2))):
        got = httpx.post(server.url + "/generate", json=body, timeout=60).json()
        if isinstance(want, list):
            _same([_strip(g) for g in got], json.loads(json.dumps([_strip(w) for w in want])))
        else:
            _same(_strip(got), json.loads(json.dumps(_strip(want))))


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
