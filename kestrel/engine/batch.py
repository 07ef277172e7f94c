"""The record the scheduler hands to the model runner for one forward: plain CPU data, no tensors on device.

Built on the scheduler's thread while the previous batch still runs (overlap scheduling); the runner turns it
into a ForwardBatch on the forward thread. A decode input whose token is not sampled yet is a future reference
(`-(index + 1)` into the runner's future-token buffer), resolved on the device right before the forward.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from kestrel.engine.request import Req
from kestrel.engine.sampler import SamplingState
from kestrel.models.forward_batch import ForwardMode
from kestrel.ops import int_tensor  # noqa: F401 - re-exported: the scheduler's and runner's host integers


# off: every pending result allocates its pinned host buffers and creates its event (the baseline of _HostCopies)
REUSE_PINNED = True


def padded_rows(rows, width: int, pad, n_rows: int | None = None) -> list[int]:
    """rows (sequences of ints), each padded to `width` with `pad` (one value, or one per row), then rows of pad
    alone up to n_rows (one pad value only), flattened row-major."""
    pads = pad if isinstance(pad, (list, tuple)) else [pad] * len(rows)
    flat: list[int] = []
    for row, p in zip(rows, pads, strict=True):
        flat += row
        flat += [p] * (width - len(row))
    if n_rows is not None:
        flat += [pad] * (width * (n_rows - len(rows)))
    return flat


@dataclass
class Batch:
    mode: ForwardMode
    reqs: list[Req]
    input_ids: list[int]  # packed; negative entries are future references
    extend_lens: list[int]
    prefix_lens: list[int]
    page_table: torch.Tensor  # [requests, their most pages] int32 on the host: physical pages, scratch-padded
    out_cache_loc: list[int]
    state_slots: list[int]
    # rows (indices into reqs) whose last token is fed now, so a token is sampled for them
    sample_rows: list[int]
    # where each sampled token goes in the future-token buffer, parallel to sample_rows
    future_idx: list[int]
    sampling_states: list[SamplingState]
    # speculative decoding: rows whose features at their last token the drafter keeps (the sample rows, and a
    # prefill chunk ending one token short of its request's known tokens: that token is the next verify's input)
    feature_rows: list[int] = field(default_factory=list)
    want_logprobs: bool = False
    top_logprobs_num: int = 0
    # memory operations (restores, unified-pool moves, poison) in decision order, run before the forward;
    # then the forward writes its snapshots (track: per sequence, (tokens into the extend, physical slot))
    mem_ops: list[tuple] = field(default_factory=list)
    track: list[tuple[int, int] | None] | None = None
    # VERIFY: drafts allowed per request (the budget and context left), and per request an optional
    # (committed steps, physical slot) where the fold leaves a prefix-cache snapshot if that many steps commit
    max_drafts: list[int] = field(default_factory=list)
    spec_snapshots: list[tuple[int, int] | None] | None = None
    # VERIFY: where each request's last token and prefix length after its commit go in the runner's future buffers,
    # and (a verify chained onto one in flight) the index the request's prefix length is read from (-1: none)
    verify_future: list[int] = field(default_factory=list)
    chain_refs: list[int] = field(default_factory=list)
    # VERIFY: greedy verify steps chained in this one launch (each request's later steps chained onto its earlier
    # ones on the device: `SpecWorker._run_greedy`), and per request the future entries of its steps before the last
    # (verify_future holds the last one's, which a later launch chains onto). DECODE: decode steps in this launch
    # (`num_continuous_decode_steps`: `ModelRunner._run_steps`), each feeding the next its tokens on the device;
    # out_cache_loc and future_idx then hold an entry per request per step, step-major, as do the result's tokens
    launch_steps: int = 1
    step_futures: list[list[int]] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class BatchResult:
    tokens: list[int]  # one per sample row (until `resolve`, possibly still on their way from the device)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # VERIFY: per request the tokens it gains (accepted drafts + the target's token), drafts verified, whether
    # the snapshot was taken, and per-token logprobs
    spec_tokens: list[list[int]] | None = None
    spec_drafted: list[int] | None = None
    spec_snapshots: list[bool] | None = None
    spec_logprobs: list[list[float]] | None = None
    spec_top_logprobs: list[list | None] | None = None
    spec_steps: int = 1  # verify steps the result covers (the batch's launch_steps)

    # (event, tokens, logprobs, (top values, top ids)) copying into pinned host memory; see `pending`
    copying: tuple | None = None
    # a result whose fields a function fills in once the device has produced them (a speculative step on the
    # device): `resolve` calls it once
    deferred: Callable[[], "BatchResult"] | None = None

    @classmethod
    def pending(cls, tokens: torch.Tensor, logprobs: torch.Tensor | None = None,
                top: tuple[torch.Tensor, torch.Tensor] | None = None) -> "BatchResult":
        """A result whose tensors are still being computed: on CUDA, start non-blocking copies into pinned memory
        and record an event, so that the forward thread can launch the next batch before these values exist (the
        scheduler `resolve`s them on its own thread); elsewhere read them now."""
        if tokens.device.type != "cuda":
            return cls(*_lists(tokens, logprobs, top))
        if REUSE_PINNED:
            return cls([], copying=_HOST_COPIES.start(tokens, logprobs, top))

        def host(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)

        parts = (host(tokens), None if logprobs is None else host(logprobs),
                 None if top is None else (host(top[0]), host(top[1])))
        event = torch.cuda.Event()
        event.record()
        return cls([], copying=(event, *parts))

    def resolve(self) -> "BatchResult":
        """Wait for the copies `pending` started, or the deferred result (a no-op for a result built from lists);
        idempotent."""
        if self.deferred is not None:
            done, self.deferred = self.deferred(), None
            for f in fields(self):
                setattr(self, f.name, getattr(done, f.name))
        if self.copying is not None:
            event, *parts = self.copying
            event.synchronize()
            self.tokens, self.logprobs, self.top_logprobs = _lists(*parts)
            self.copying = None
            if REUSE_PINNED:
                _HOST_COPIES.done(event, parts)
        return self


class _HostCopies:
    """Pinned host buffers and CUDA events for results copied back from the device, reused from step to step. A
    buffer belongs to the result it holds until `resolve` has read it (after its event), and only then goes back
    to the pool, so reuse needs no event of its own. A new pinned buffer and event per result cost the host of
    every overlapped decode step (benchmarks/host_copies.py); a result never resolved just leaves its buffers to
    the garbage collector."""

    def __init__(self):
        self.buffers: dict[tuple, list[torch.Tensor]] = {}  # (dtype, shape) -> free buffers
        self.events: dict[int, list[torch.cuda.Event]] = {}  # device index -> free events (recorded there before)
        self.lock = threading.Lock()  # (the server's engine thread and a test's thread may both resolve)

    def start(self, tokens: torch.Tensor, logprobs: torch.Tensor | None, top: tuple | None) -> tuple:
        """(event, host tokens, host logprobs, (host top values, host top ids)): the copies queued, the event
        recorded after them on the current device's current stream."""
        with self.lock:
            free = self.events.get(torch.cuda.current_device())
            event = free.pop() if free else torch.cuda.Event()
            parts = (self._copy(tokens), None if logprobs is None else self._copy(logprobs),
                     None if top is None else (self._copy(top[0]), self._copy(top[1])))
        event.record()
        return (event, *parts)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        free = self.buffers.get((t.dtype, t.shape))
        host = free.pop() if free else torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)

    def done(self, event: torch.cuda.Event, parts) -> None:
        """Take back a resolved result's event and buffers (their values already read)."""
        tokens, logprobs, top = parts
        with self.lock:
            self.events.setdefault(event.device.index, []).append(event)  # (recorded: it has its device)
            for host in (tokens, logprobs, *(top or ())):
                if host is not None:
                    self.buffers.setdefault((host.dtype, host.shape), []).append(host)


_HOST_COPIES = _HostCopies()


def _lists(tokens: torch.Tensor, logprobs: torch.Tensor | None, top: tuple | None):
    top_lists = None
    if top is not None:
        vals, idx = top
        top_lists = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
    return tokens.tolist(), None if logprobs is None else logprobs.tolist(), top_lists
