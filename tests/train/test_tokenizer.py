import json

import pytest

from kestrel.tokenizer import Tokenizer
from kestrel.train import corpus
from kestrel.train.tokenizer_train import CHAT_TEMPLATE, SPECIAL_TOKENS, STOP_IDS, render_chat, train_tokenizer

CODE = (
    "class Fib:\n"
    '    """Fibonacci numbers — naïve version, 中文, emoji 🐍."""\n'
    "\n"
    "    def __call__(self, n: int) -> int:\n"
    "        if n < 2:\r\n"
    "\t\treturn n  # tabs\n"
    "        return self(n - 1) + self(n - 2)\n"
    "\n\n\n"
    "x = 1234567890  \n"
)


def test_special_tokens_at_fixed_ids(tokenizer_dir):
    tok = Tokenizer(tokenizer_dir)
    assert tok.vocab_size == 4096
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_id(s) == i
    assert (tok.bos_token_id, tok.eos_token_id, tok.token_id(tok.pad_token)) == (1, 2, 0)
    config = json.loads((tokenizer_dir / "generation_config.json").read_text())
    assert config["eos_token_id"] == [2, 7] == list(STOP_IDS)


def test_round_trip_is_exact(tokenizer_dir, code_slice):
    tok = Tokenizer(tokenizer_dir)
    ids = tok.encode(CODE)
    assert ids[0] == 1  # <|bos|> starts every prompt, as every training document
    assert tok.decode(ids) == CODE
    for _, text in code_slice[:10]:
        assert tok.decode(tok.encode(text)) == text


def test_digits_one_token_each(tokenizer_dir):
    tok = Tokenizer(tokenizer_dir)
    for number in ("7", "12345", "1000000", "-42"):
        ids = tok.encode(number, add_special_tokens=False)
        digits = [t for t in ids if tok.decode([t]).isdigit()]
        assert [tok.decode([t]) for t in digits] == [c for c in number if c.isdigit()]
    assert len(tok.encode("x = 90210", add_special_tokens=False)) >= 5


def test_code_compresses(tokenizer_dir):
    tok = Tokenizer(tokenizer_dir)
    text = "".join(t for _, t in corpus.stdlib_files("heldout"))
    n = len(tok.encode(text, add_special_tokens=False))
    assert len(text.encode()) / n > 2.5  # bytes per token on code the merges never saw
    # a deep indentation is one or two tokens, not one per space
    assert len(tok.encode("\n" + " " * 12 + "return x", add_special_tokens=False)) <= 4


def test_chat_template(tokenizer_dir):
    tok = Tokenizer(tokenizer_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "Answer: 4"}, {"role": "user", "content": [
                    {"type": "text", "text": "And 3 + 3?"}]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert text == ("<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
                    "<|im_user|>user<|im_middle|>What is 2 + 2?<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|>Answer: 4<|im_end|>"
                    "<|im_user|>user<|im_middle|>And 3 + 3?<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|>")
    assert text == render_chat(messages, add_generation_prompt=True)
    assert json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    ids = tok.encode(text, add_special_tokens=False)
    # every special token in the text is one id, never spelt out in pieces
    assert [i for i in ids if i < len(SPECIAL_TOKENS)] == [3, 6, 7, 4, 6, 7, 5, 6, 7, 4, 6, 7, 5, 6]
    assert tok.decode(ids, skip_special_tokens=False) == text
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "robot", "content": "hi"}])


def test_too_little_text_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not vocab_size 4096"):
        train_tokenizer(["just a few words"], tmp_path)
