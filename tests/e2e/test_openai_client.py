"""The official openai client against a real server: greedy outputs equal the offline Engine's (the exactness
contract, through HTTP), streaming and not, n > 1, stop strings, logprobs, usage."""

import openai
import pytest

from tests.e2e.conftest import CONTEXT

pytestmark = pytest.mark.e2e

PROMPTS = ["def fib(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):", "x = [1, 2, 3]\nprint("]
GREEDY = {"temperature": 0, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60) as c:
        yield c


def _chat_text(engine, content: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": content}])


def test_models(client, model_name):
    models = client.models.list().data
    assert [m.id for m in models] == [model_name]


def test_completions_greedy_equal_offline_engine(client, engine, model_name):
    for prompt in PROMPTS:
        want = engine.generate(prompt, GREEDY)
        got = client.completions.create(model=model_name, prompt=prompt, max_tokens=12, temperature=0)
        assert got.choices[0].text == want["text"]
        assert got.choices[0].finish_reason == want["meta_info"]["finish_reason"]["type"]
        assert got.usage.prompt_tokens == want["meta_info"]["prompt_tokens"]
        assert got.usage.completion_tokens == want["meta_info"]["completion_tokens"]
        streamed = client.completions.create(model=model_name, prompt=prompt, max_tokens=12, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
        chunks = list(streamed)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want["text"]
        assert chunks[-1].usage.completion_tokens == want["meta_info"]["completion_tokens"]


def test_chat_greedy_equal_offline_engine(client, engine, model_name):
    for content in PROMPTS[:3]:
        want = engine.generate(_chat_text(engine, content), GREEDY)
        messages = [{"role": "user", "content": content}]
        got = client.chat.completions.create(model=model_name, messages=messages, max_tokens=12, temperature=0)
        assert got.choices[0].message.role == "assistant"
        assert got.choices[0].message.content == want["text"]
        assert got.usage.prompt_tokens == want["meta_info"]["prompt_tokens"]
        stream = client.chat.completions.create(model=model_name, messages=messages, max_completion_tokens=12,
                                                temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want["text"]


def test_token_id_prompts_and_batches(client, engine, model_name):
    ids = [[1, 500, 600, 700], [1, 42, 43]]
    got = client.completions.create(model=model_name, prompt=ids, max_tokens=6, temperature=0)
    want = engine.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 6})
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [w["text"] for w in want]
    assert got.usage.prompt_tokens == 7


def test_n_choices_with_seed_equal_offline_engine(client, engine, model_name):
    params = {"temperature": 1.0, "max_new_tokens": 10, "n": 3, "seed": 11, "ignore_eos": True}
    want = engine.generate(PROMPTS[0], params)
    got = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=10, temperature=1.0, n=3,
                                    seed=11, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in got.choices) == [0, 1, 2]
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == [w["text"] for w in want]
    assert got.usage.completion_tokens == 30
    stream = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], n=2,
                                            max_tokens=5, seed=3, stream=True, extra_body={"ignore_eos": True})
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    whole = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], n=2,
                                           max_tokens=5, seed=3, extra_body={"ignore_eos": True})
    assert [whole.choices[i].message.content for i in (0, 1)] == [texts[0], texts[1]]


def test_stop_strings(client, engine, model_name):
    prompt = PROMPTS[1]
    full = engine.generate(prompt, {**GREEDY, "max_new_tokens": 16})["text"]
    assert len(full) > 6, full
    stop = full[3:5]
    want = engine.generate(prompt, {**GREEDY, "max_new_tokens": 16, "stop": [stop, "\x00never"]})
    assert want["meta_info"]["finish_reason"]["type"] == "stop"
    assert want["text"] == full[: full.find(stop)]
    for stop_arg in (stop, [stop, "\x00never"]):
        got = client.completions.create(model=model_name, prompt=prompt, max_tokens=16, temperature=0, stop=stop_arg)
        assert got.choices[0].text == want["text"] and got.choices[0].finish_reason == "stop"
        stream = client.completions.create(model=model_name, prompt=prompt, max_tokens=16, temperature=0,
                                           stop=stop_arg, stream=True)
        chunks = [c for c in stream if c.choices]
        assert "".join(c.choices[0].text for c in chunks) == want["text"]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_formats(client, engine, model_name):
    want = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 4}, return_logprob=True, top_logprobs_num=2)
    want_lps = [lp for lp, _, _ in want["meta_info"]["output_token_logprobs"]]
    got = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=2)
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want_lps, abs=1e-5)
    assert len(lp.tokens) == 4 and all(len(t) <= 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    stream = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}],
                                            max_tokens=3, temperature=0, logprobs=True, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([c.logprob for c in content], abs=1e-6)


def test_penalties_and_top_p_accepted(client, model_name):
    got = client.completions.create(model=model_name, prompt="a", max_tokens=5, temperature=0.7, top_p=0.9,
                                    frequency_penalty=0.5, presence_penalty=0.3, seed=1,
                                    extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 5


def test_cached_tokens_in_usage(client, model_name):
    prompt = list(range(10, 10 + 200))
    first = client.completions.create(model=model_name, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=model_name, prompt=prompt + [7, 8], max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 64 <= second.usage.prompt_tokens_details.cached_tokens <= 200


def test_max_tokens_defaults(client, model_name):
    # completions default to 16 tokens; a budget as long as the context stops at the context's end
    got = client.completions.create(model=model_name, prompt="z", temperature=0, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 16
    big = client.completions.create(model=model_name, prompt=list(range(100, CONTEXT - 20)), max_tokens=CONTEXT,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert big.usage.completion_tokens + big.usage.prompt_tokens == CONTEXT
    assert big.choices[0].finish_reason == "length"
