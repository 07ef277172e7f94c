"""Req: one generation request as the scheduler, memory managers and model runner see it."""

import enum
import time
from dataclasses import dataclass, field

from kestrel.engine.sampling_params import SamplingParams


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int  # admission order (first come, first served); a retracted request keeps its place
    seed: int  # sampling seed (the request's, or one drawn from the engine's seeded RNG)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    stop_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: dict | None = None
    status: ReqStatus = ReqStatus.WAITING
    # progress, in the scheduler's view: tokens whose KV and state the submitted forwards produce
    computed_len: int = 0
    # sampled tokens whose values the scheduler has not seen yet (overlap scheduling: 0 or 1; a launch of several
    # decode steps: up to its steps)
    pending: int = 0
    # submitted batches including this request whose results are not processed yet
    inflight: int = 0
    # memory: page table over positions 0..computed_len-1, working KDA state slot
    pages: list[int] = field(default_factory=list)
    # bumped whenever `pages` changes other than by appending or by being replaced by a new list (the prefix cache
    # swapping shared pages in at its head): the scheduler's host page table then rewrites the request's row
    pages_epoch: int = 0
    slot: int | None = None
    # prefix cache: prompt tokens served from the cache at first admission; pages at the head of `pages`
    # borrowed from the cache (not the request's own); the locked node of the match
    cached_tokens: int = 0
    shared_pages: int = 0
    cache_node: object = None
    retractions: int = 0
    # speculative decoding: verify steps and drafted tokens accepted
    spec_verify_ct: int = 0
    spec_accepted: int = 0
    created_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def known_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def total_len(self) -> int:
        """Tokens in the sequence, the pending (sampled, not yet seen) ones included."""
        return self.known_len + self.pending

    @property
    def remaining(self) -> int:
        """Tokens not yet fed to a forward: > 1 while prefilling, 1 while decoding."""
        return self.total_len - self.computed_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def token_at(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens start..end-1 (all known: end <= known_len), as a new list."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def budget_left(self) -> int:
        """Output tokens this request may still produce, counting the pending ones as produced."""
        return self.params.max_new_tokens - len(self.output_ids) - self.pending

    def keep_logprobs(self, logprob: float, top: list | None) -> None:
        """A new token's logprob (and top alternatives) if this request asked for them (a batch computes them for
        every row when one row does)."""
        if self.return_logprob or self.top_logprobs_num:
            self.output_logprobs.append(logprob)
            if self.top_logprobs_num and top is not None:
                self.output_top_logprobs.append(top[: self.top_logprobs_num])
