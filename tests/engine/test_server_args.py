"""ServerArgs defaults that depend on the device, and their validation."""

import pytest
import torch

from kestrel.config import ServerArgs


def test_chunked_prefill_size_defaults_by_device_and_is_kept_when_given():
    assert ServerArgs(device="cpu").chunked_prefill_size is None
    assert ServerArgs(device="cpu").prefill_chunk_tokens == 2048
    assert ServerArgs(device="cpu", chunked_prefill_size=48).prefill_chunk_tokens == 48
    with pytest.raises(ValueError, match="chunked-prefill-size"):
        ServerArgs(chunked_prefill_size=0)
    if torch.cuda.is_available():  # by the card's memory, as SGLang sizes it
        gib = torch.cuda.get_device_properties(0).total_memory / (1 << 30)
        assert ServerArgs(device="cuda").prefill_chunk_tokens == (2048 if gib < 35 else 4096 if gib < 60 else 8192)
