import pytest
import torch

from kestrel.train import corpus
from kestrel.train.tokenizer_train import train_tokenizer

# enough stdlib text for 4096 tokens' worth of merges in about a second
TOKENIZER_FILES = 40


@pytest.fixture(autouse=True)
def one_thread():
    # the test machine's cores are shared: oversubscribed intra-op threads make tiny models 100x slower
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def code_slice() -> list[tuple[str, str]]:
    return corpus.stdlib_files("train", limit=TOKENIZER_FILES)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, code_slice):
    out = tmp_path_factory.mktemp("tokenizer")
    return train_tokenizer(corpus.tokenizer_texts(code_slice, seed=0, arith_docs=2000), out)
