"""The bundled model's tokenizer: byte-level BPE with digits split one per token, special tokens at fixed ids.

Byte-level, so any text round-trips exactly (Python indentation, tabs, unicode); digits never merge, so every
number is spelled digit by digit (what makes column arithmetic learnable); runs of spaces become single tokens
because the merges are learnt on Python source. The chat template is Kimi's layout:
`<|im_user|>user<|im_middle|>...<|im_end|><|im_assistant|>assistant<|im_middle|>...<|im_end|>`.
"""

import functools
import json
from collections.abc import Iterable
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# fixed ids 0..7, in this order
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_system|>", "<|im_user|>", "<|im_assistant|>",
                  "<|im_middle|>", "<|im_end|>")
PAD, BOS, EOS, IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END = range(len(SPECIAL_TOKENS))
# generation stops at the end of a document or of an assistant turn
STOP_IDS = (EOS, IM_END)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>"
    "{%- elif message['role'] in ('system', 'tool') -%}<|im_system|>"
    "{%- else -%}{{ raise_exception('unknown chat role ' ~ message['role']) }}"
    "{%- endif -%}"
    "{{ message['role'] }}<|im_middle|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE rendered as kestrel.tokenizer.Tokenizer renders it, without needing the tokenizer files."""
    return _template().render(messages=messages, add_generation_prompt=add_generation_prompt)


@functools.cache
def _template():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(CHAT_TEMPLATE)


def pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def train_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 4096,
                    model_max_length: int = 4096) -> Path:
    """Learn the merges on `texts` and write tokenizer.json, tokenizer_config.json and generation_config.json.

    The vocabulary is exactly `vocab_size` (specials + 256 bytes + merges); too little text to learn that many
    merges is an error.
    """
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges beyond {len(SPECIAL_TOKENS)} "
                         f"special tokens and 256 bytes")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the training text yields {tok.get_vocab_size()} tokens, not vocab_size {vocab_size}: "
                         f"give it more text")
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, f"special token {s} landed at id {tok.token_to_id(s)}, not {i}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
        # every document is trained as <|bos|> text <|eos|>, so prompts start with <|bos|> too
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": BOS, "eos_token_id": list(STOP_IDS), "pad_token_id": PAD}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


def _raise(message: str):
    raise TemplateError(message)
