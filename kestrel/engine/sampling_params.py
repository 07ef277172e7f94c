"""Per-request sampling parameters, with SGLang's `sampling_params` names, validated at the edge."""

import dataclasses
from dataclasses import dataclass, field


class InvalidRequest(ValueError):
    """A request the engine refuses; the message names the offending value (HTTP 400)."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> "SamplingParams":
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidRequest(f"unknown sampling parameter(s) {unknown}; known: {sorted(names)}")
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        for key in ("stop", "stop_token_ids"):
            if d.get(key) is None:
                d.pop(key, None)
        p = cls(**d)
        p.validate()
        return p

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self, vocab_size: int | None = None) -> None:
        def need(name, ok, why):
            if not ok:
                raise InvalidRequest(f"sampling parameter {name} = {getattr(self, name)!r}: {why}")

        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        need("max_new_tokens", is_int(self.max_new_tokens) and self.max_new_tokens >= 0, "must be an integer >= 0")
        need("min_new_tokens", is_int(self.min_new_tokens) and 0 <= self.min_new_tokens, "must be an integer >= 0")
        need("temperature", is_num(self.temperature) and 0 <= self.temperature <= 100, "must be in [0, 100]")
        need("top_p", is_num(self.top_p) and 0 < self.top_p <= 1, "must be in (0, 1]")
        need("top_k", is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1), "must be -1 or >= 1")
        need("min_p", is_num(self.min_p) and 0 <= self.min_p <= 1, "must be in [0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            need(name, is_num(getattr(self, name)) and -2 <= getattr(self, name) <= 2, "must be in [-2, 2]")
        need("repetition_penalty", is_num(self.repetition_penalty) and 0 < self.repetition_penalty <= 2, "must be in (0, 2]")
        need("stop", isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
             "must be a non-empty string or a list of them")
        need("stop_token_ids", isinstance(self.stop_token_ids, list) and all(is_int(t) for t in self.stop_token_ids),
             "must be a list of token ids")
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
            need("stop_token_ids", not bad, f"token ids {bad} are outside the vocabulary [0, {vocab_size})")
        need("n", is_int(self.n) and 1 <= self.n <= 128, "must be an integer in [1, 128]")
        need("seed", self.seed is None or is_int(self.seed), "must be an integer")
        for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            need(name, isinstance(getattr(self, name), bool), "must be a boolean")
