"""Tokenizers through the `tokenizers` library (tokenizer.json) plus jinja chat templates.

The chat template comes from tokenizer_config.json's `chat_template` or a chat_template.jinja file, rendered in a
sandbox the way transformers does (messages, add_generation_prompt, bos_token, eos_token).
"""

import json
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        self.tok = HFTokenizer.from_file(str(file))
        folder = file.parent
        config = {}
        if (folder / "tokenizer_config.json").exists():
            config = json.loads((folder / "tokenizer_config.json").read_text())
        self.chat_template = config.get("chat_template")
        if self.chat_template is None and (folder / "chat_template.jinja").exists():
            self.chat_template = (folder / "chat_template.jinja").read_text()
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self.pad_token = _token_str(config.get("pad_token"))
        self.add_bos = bool(config.get("add_bos_token", False))
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tok.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.bos_token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def incremental_decoder(self, skip_special_tokens: bool = True) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas; holds back bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        decode = lambda a, b: self.tokenizer.decode(self.ids[a:b], self.skip)  # noqa: E731
        prefix = decode(self.prefix_offset, self.read_offset)
        full = decode(self.prefix_offset, len(self.ids))
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        """What is left at the end (possibly a replacement character for truly invalid bytes)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tokenizer.decode(self.ids[self.prefix_offset:], self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]


def _token_str(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _raise(message):
    raise TemplateError(message)
