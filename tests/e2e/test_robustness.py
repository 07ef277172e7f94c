"""Trouble: every kind of bad request is a 400 with an OpenAI error body (and the server keeps serving); clients
that vanish mid-request free everything they held; 64 concurrent streams all finish exactly; /metrics counts it."""

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import CONTEXT, metrics, wait_idle

pytestmark = pytest.mark.e2e

C, CHAT, GEN = "/v1/completions", "/v1/chat/completions", "/generate"
MSG = [{"role": "user", "content": "hi"}]

# (route, body (raw bytes or JSON), param the error names or None, words the message contains)
BAD = [
    (C, b'{"prompt": "x", ', None, "JSON"),
    (C, b"[1, 2]", None, "dictionary"),
    (C, b"", None, "empty"),
    (C, {"max_tokens": 3}, "prompt", "Field required"),
    (C, {"prompt": 5}, "prompt", "valid"),
    (C, {"prompt": "x", "max_tokens": "5"}, "max_tokens", "integer"),
    (C, {"prompt": "x", "max_tokens": True}, "max_tokens", "integer"),
    (C, {"prompt": "x", "stream": "yes"}, "stream", "boolean"),
    (C, {"prompt": "x", "model": "gpt-4o"}, "model", "gpt-4o"),
    (C, {"prompt": "x", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    (C, {"prompt": "x", "max_tokens": CONTEXT + 1}, "max_tokens", "context length"),
    (C, {"prompt": "x", "max_tokens": 10**30}, "max_tokens", "context length"),
    (C, {"prompt": "x", "temperature": -0.1}, "temperature", "greater than or equal to 0"),
    (C, {"prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
    (C, {"prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
    (C, {"prompt": "x", "logprobs": 50}, "logprobs", "less than or equal to 20"),
    (C, {"prompt": "x", "frequency_penalty": 3}, "frequency_penalty", "less than or equal to 2"),
    (C, {"prompt": "x", "stop": ""}, None, "stop"),
    (C, {"prompt": "x", "stop": [1]}, "stop", "valid"),
    (C, {"prompt": "x", "logit_bias": {"5": 1.0}}, "logit_bias", "not supported"),
    (C, {"prompt": "x", "echo": True}, "echo", "not supported"),
    (C, {"prompt": list(range(1, CONTEXT + 1))}, None, "context length"),
    (C, {"prompt": "hello " * 2000}, None, "context length"),
    (C, {"prompt": [1, 2, 4096]}, None, "outside the vocabulary"),
    (C, {"prompt": [1, -3]}, None, "outside the vocabulary"),
    (C, {"prompt": []}, None, "empty"),
    (C, {"prompt": "x", "stop_token_ids": [99999]}, None, "outside the vocabulary"),
    (CHAT, {"messages": []}, "messages", "at least 1"),
    (CHAT, {"messages": [{"content": "x"}]}, "messages", "Field required"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages", "wizard"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "image_url"),
    (CHAT, {"messages": MSG, "max_completion_tokens": CONTEXT * 2}, "max_completion_tokens", "context length"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, "top_logprobs", "logprobs"),
    (CHAT, {"messages": MSG, "model": ""}, "model", "not served"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function"}]}, "tools", "not supported"),
    (CHAT, {"messages": "hi"}, "messages", "valid list"),
    (GEN, {"text": "x", "input_ids": [1]}, "text", "exactly one"),
    (GEN, {}, "text", "exactly one"),
    (GEN, {"text": "x", "sampling_params": {"max_new_tokenz": 3}}, None, "max_new_tokenz"),
    (GEN, {"text": "x", "sampling_params": {"temperature": "hot"}}, None, "temperature"),
    (GEN, {"text": "x", "sampling_params": {"max_new_tokens": CONTEXT + 5}}, "max_new_tokens", "context length"),
    (GEN, {"text": "x", "sampling_params": {"n": 1000}}, None, "n ="),
    (GEN, {"input_ids": [5, 4096]}, None, "outside the vocabulary"),
    (GEN, {"text": "x", "top_logprobs_num": 100}, "top_logprobs_num", "less than or equal to 20"),
    (GEN, {"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "1 sampling_params for 2"),
    (GEN, {"text": "x", "sampling_params": [1]}, "sampling_params", "dictionary"),
    (GEN, {"input_ids": [1, 2], "rid": ["a", "b"]}, "rid", "2 rids for 1"),
]


@pytest.mark.parametrize("route,body,param,words", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_request_is_400_then_server_serves(server, route, body, param, words):
    if isinstance(body, dict) and route != GEN:
        body = {"max_tokens": 2, **body}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + route, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert words.lower() in err["message"].lower(), err
    if param is not None:
        assert err["param"] == param, err
    ok = httpx.post(server.url + C, json={"prompt": "ok", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_unknown_route_and_method(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = httpx.get(server.url + C)
    assert r.status_code == 405 and r.json()["error"]["code"] == 405


def _abort_count(m: dict) -> float:
    return m.get('requests_finished_total{finish_reason="abort"}', 0.0)


def _assert_idle(m: dict) -> None:
    assert m["num_running_reqs"] == 0 and m["num_waiting_reqs"] == 0, m
    assert m["kv_pages_used"] == m["kv_pages_cached"], m
    assert m["state_slots_used"] == m["state_slots_cached"], m


def test_disconnected_stream_frees_its_request(server):
    before = _abort_count(wait_idle(server.url))
    body = {"prompt": "abc", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.url + C, json=body) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert metrics(server.url)["num_running_reqs"] == 1
    m = wait_idle(server.url)
    _assert_idle(m)
    assert _abort_count(m) == before + 1


def test_killed_client_process_frees_its_request(server):
    before = _abort_count(wait_idle(server.url))
    script = (
        "import httpx, sys\n"
        f"with httpx.stream('POST', '{server.url}/generate', json={{'input_ids': [1, 2, 3], 'stream': True, "
        "'sampling_params': {'max_new_tokens': 450, 'ignore_eos': True}}, timeout=30) as r:\n"
        "    for line in r.iter_lines():\n"
        "        print(line[:20], flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("data: ")
        assert metrics(server.url)["num_running_reqs"] == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    m = wait_idle(server.url)
    _assert_idle(m)
    assert _abort_count(m) == before + 1


def test_client_that_gives_up_on_a_whole_response_frees_it(server):
    before = _abort_count(wait_idle(server.url))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + CHAT, json={"messages": MSG, "max_tokens": 480, "ignore_eos": True}, timeout=0.5)
    m = wait_idle(server.url)
    _assert_idle(m)
    assert _abort_count(m) == before + 1


def test_abort_request_endpoint(server):
    wait_idle(server.url)
    result = {}

    def run():
        result["out"] = httpx.post(server.url + GEN, json={"input_ids": [1, 2], "rid": "to-abort", "sampling_params":
                                   {"max_new_tokens": 450, "ignore_eos": True}}, timeout=60).json()

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while metrics(server.url)["num_running_reqs"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    dup = httpx.post(server.url + GEN, json={"input_ids": [1], "rid": "to-abort"}, timeout=30)
    assert dup.status_code == 400 and "already in use" in dup.json()["error"]["message"]
    assert httpx.post(server.url + "/abort_request", json={"rid": "to-abort"}).json() == {"aborted": 1}
    t.join(30)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 450
    _assert_idle(wait_idle(server.url))


def test_64_concurrent_streams_finish_exactly(server, model_name):
    before = wait_idle(server.url)
    n = 64
    lens = [(3 + i % 29, 8 + (7 * i) % 25) for i in range(n)]  # (prompt tokens, output tokens)

    async def one(client, i):
        plen, olen = lens[i]
        stream = await client.completions.create(
            model=model_name, prompt=[100 + (i * 13 + k) % 3000 for k in range(plen)], max_tokens=olen,
            temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        return finish, usage

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120,
                                      http_client=openai.DefaultAsyncHttpxClient(
                                          limits=httpx.Limits(max_connections=n))) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    results = asyncio.run(main())
    for (plen, olen), (finish, usage) in zip(lens, results):
        assert finish == "length"
        assert (usage.prompt_tokens, usage.completion_tokens) == (plen, olen)
    after = wait_idle(server.url)
    _assert_idle(after)

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    assert delta("generation_tokens_total") == sum(o for _, o in lens)
    assert delta("prompt_tokens_total") == sum(p for p, _ in lens)
    assert delta('requests_finished_total{finish_reason="length"}') == n
    assert delta("time_to_first_token_seconds_count") == n
    assert delta("e2e_request_latency_seconds_count") == n
    assert delta("inter_token_latency_seconds_count") == sum(o - 1 for _, o in lens)
    assert after["kv_pages_total"] > 0 and after["state_slots_total"] > 0
