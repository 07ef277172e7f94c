import pytest

from kestrel.models.registry import BUNDLED
from kestrel.tokenizer import Tokenizer
from tests.server.tokenizers import tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer(tokenizer_dir(tmp_path_factory) or BUNDLED)
