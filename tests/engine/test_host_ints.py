"""The host-side integer packing every step uses (kestrel.engine.batch): against torch.tensor on nested lists."""

import random

import pytest
import torch

from kestrel.engine.batch import int_tensor, padded_rows


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_int_tensor_equals_torch_tensor(dtype):
    rng = random.Random(7)
    hi = 2**62 if dtype == torch.long else 2**31 - 1
    for n in (0, 1, 5, 1000):
        values = [rng.randint(-hi, hi) for _ in range(n)]
        t = int_tensor(values, dtype)
        assert t.dtype == dtype and torch.equal(t, torch.tensor(values, dtype=dtype))
    with pytest.raises(OverflowError):
        int_tensor([2**31], torch.int32)


def test_padded_rows_equals_nested_padding():
    rng = random.Random(3)
    rows = [[rng.randint(-50, 50) for _ in range(rng.randint(0, 9))] for _ in range(6)]
    width = max(map(len, rows)) + 2
    want = [r + [-7] * (width - len(r)) for r in rows] + [[-7] * width] * 3
    assert torch.equal(int_tensor(padded_rows(rows, width, -7, 9)).view(9, width), torch.tensor(want))
    pads = [rng.randint(100, 200) for _ in rows]  # one pad value per row
    want = [r + [p] * (width - len(r)) for r, p in zip(rows, pads)]
    assert padded_rows([tuple(r) for r in rows], width, pads) == [x for r in want for x in r]


def test_req_tokens_are_token_at_over_any_range():
    import random

    from kestrel.engine.request import Req
    from kestrel.engine.sampling_params import SamplingParams

    rng = random.Random()
    for _ in range(200):
        r = Req("r", [rng.randrange(100) for _ in range(rng.randint(1, 9))], SamplingParams(), 0, 0)
        r.output_ids = [rng.randrange(100) for _ in range(rng.randint(0, 9))]
        end = rng.randint(0, r.known_len)
        start = rng.randint(0, end)
        assert r.tokens(start, end) == [r.token_at(i) for i in range(start, end)]
