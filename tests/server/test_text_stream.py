"""Streamed text equals the whole text (kestrel.engine.engine.output_text) whatever the token boundaries, with
stop strings held back until they can no longer start and trimmed when matched."""

import pytest

from kestrel.engine.engine import output_text
from kestrel.engine.request import Req
from kestrel.engine.sampling_params import SamplingParams
from kestrel.server.serving import TextStream, _held_back

TEXT = "def f(x):\n    return x * 2  # doubled: ünïcode ✓\n\nprint(f(21))\n"


def stream(tokenizer, ids: list[int], reason: dict, steps: list[int], **params) -> tuple[str, Req]:
    """Feed ids in chunks of the given sizes (the finish arrives with the last); returns the joined deltas."""
    req = Req("r", [1], SamplingParams(**params), 0, 0)
    ts, out, i = TextStream(req, tokenizer), [], 0
    for k in steps:
        req.output_ids.extend(ids[i:i + k])
        i += k
        if i >= len(ids):
            req.finish_reason = reason
        out.append(ts.advance()[0])
    assert i >= len(ids)
    return "".join(out), req


@pytest.mark.parametrize("steps", [[1] * 200, [3] * 70, [7] * 30, [200]])
def test_deltas_join_to_the_whole_text(tokenizer, steps):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    text, req = stream(tokenizer, ids, {"type": "length", "length": len(ids)}, steps)
    assert text == output_text(req, tokenizer) == TEXT


@pytest.mark.parametrize("stop", ["return", "\n\n", "✓", "# doubled"])
def test_stop_string_is_held_back_and_trimmed(tokenizer, stop):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    # the engine stops on the token that completes the stop string
    end = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
    ids = ids[:end]
    reason = {"type": "stop", "matched": stop}
    text, req = stream(tokenizer, ids, reason, [1] * len(ids), stop=[stop])
    assert text == output_text(req, tokenizer) == TEXT[: TEXT.find(stop)]
    kept, _ = stream(tokenizer, ids, reason, [1] * len(ids), stop=[stop], no_stop_trim=True)
    assert kept == tokenizer.decode(ids) and stop in kept


def test_stop_token_is_dropped(tokenizer):
    ids = tokenizer.encode("x = 1\ny = 2", add_special_tokens=False)
    text, req = stream(tokenizer, ids, {"type": "stop", "matched": ids[-1]}, [1] * len(ids), stop_token_ids=[ids[-1]])
    assert text == output_text(req, tokenizer) == tokenizer.decode(ids[:-1])


def test_nothing_is_sent_past_a_possible_stop():
    assert _held_back("abc</", ["</stop>"]) == 2
    assert _held_back("abc<", ["</stop>", "<x"]) == 1
    assert _held_back("abc", ["</stop>"]) == 0
    assert _held_back("ab", ["b", "abc"]) == 2
