"""CUDA graphs: decode (one captured `model(ForwardBatch(DECODE))` per batch-size bucket) and speculative verify
(one per batch-size bucket and block length, captured on first use), replayed with padding.

Each bucket's graph reads static input buffers (token ids, positions, page table, state slots, sequence lengths,
cache locations); `run` copies a batch into them, pads up to the bucket with rows that point at the memory's
scratch page and scratch state slot (never handed out, so padded rows read and write harmlessly), replays, and slices
the real rows out of the static outputs. The captured forward must do no host synchronisation and read no host
values that change between steps: decode kernels read `fb.seq_lens_t`, never `fb.seq_lens`.
"""

import dataclasses

import torch

from kestrel.config import MAX_LAUNCH_STEPS
from kestrel.engine.batch import int_tensor, padded_rows
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.ops.kda import KDAReplay

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Buckets:
    """Graphs captured per batch-size bucket: a batch replays the smallest bucket that holds it."""

    batch_sizes: list[int]

    def bucket(self, bs: int) -> int | None:
        return next((b for b in self.batch_sizes if b >= bs), None)


class DecodeGraphRunner(_Buckets):
    """Decode graphs, one per batch-size bucket. A bucket's integer inputs are one [ROWS, b] block of a static
    int64 buffer (token ids, positions, state slots, cache locations, keys per sequence, and a row the graph does
    not read: where each row's sampled token goes in the future buffer), so the engine copies a step's integers in
    with one copy from the host (`run_host`) and its page table with another."""

    ROWS = 6

    def __init__(self, model, mem, batch_sizes=DEFAULT_BATCH_SIZES, max_pages_per_seq: int = 64,
                 device: torch.device | str = "cuda", future: torch.Tensor | None = None, greedy: bool = False):
        """future: the runner's future-token buffer (its last entry a scratch): negative token ids are references
        into it, resolved inside the graph (None: ids are never negative). greedy: the graph also takes each row's
        argmax and, with a future buffer, writes it there (the future-index row; padding rows write the scratch),
        so a plain greedy step needs no kernel after the replay but the tokens' copy back (`run_host`'s tokens)."""
        self.model, self.mem, self.future, self.greedy = model, mem, future, greedy
        self.future_scratch = future_scratch = 0 if future is None else future.shape[0] - 1
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        self.max_pages = max_pages_per_seq
        n = self.batch_sizes[-1]
        dev = torch.device(device)
        self.scratch_page, self.scratch_slot = mem.scratch_page, mem.scratch_slot
        self.scratch_loc = mem.scratch_page * mem.page_size
        # a padding row's integers: token 0 at position 0 of the scratch page and slot, one key, the future scratch
        self.pad = [0, 0, self.scratch_slot, self.scratch_loc, 1, future_scratch]
        self.pad_t = torch.tensor(self.pad, device=dev).view(-1, 1)
        self.ints = torch.zeros(self.ROWS * n, dtype=torch.long, device=dev)
        self.page_table = torch.full((n, max_pages_per_seq), self.scratch_page, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, object] = {}
        self.tokens: dict[int, torch.Tensor] = {}  # with greedy: each bucket's argmax tokens
        self.pool = None

    def _ints(self, b: int) -> torch.Tensor:
        return self.ints[: self.ROWS * b].view(self.ROWS, b)

    def _batch(self, bs: int) -> ForwardBatch:
        """The static ForwardBatch of a bucket. prefix_lens are placeholders: no captured code may read them."""
        ids, pos, slots, locs, seq_lens, _ = self._ints(bs)
        return ForwardBatch(ForwardMode.DECODE, ids, pos, [1] * bs, [0] * bs, mem=self.mem,
                            page_table=self.page_table[:bs], out_cache_loc=locs, state_slots=slots, seq_lens_t=seq_lens)

    @torch.no_grad()
    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool. Padding rows point at scratch page/slot 0,
        and the scratch slot is overwritten by the warm-up, so capture changes no live request's state."""
        for bs in reversed(self.batch_sizes):
            self._ints(bs).copy_(self.pad_t.expand(-1, bs))
            fb = self._batch(bs)
            self.graphs[bs], (self.outputs[bs], tokens), self.pool = capture(lambda: self._step(fb), self.pool)
            if tokens is not None:
                self.tokens[bs] = tokens

    def _step(self, fb: ForwardBatch):
        """The captured work: the forward, and with greedy the tokens (written to the future buffer too)."""
        out = self.model(self._resolved(fb))
        if not self.greedy:
            return out, None
        # torch's argmax, not ops.argmax's Triton kernel: the latter (PDL-launched) made the graph 7 us faster
        # alone but the engine's overlapped step 18 us slower (k3-mini, H200, benchmarks/device/device_run107.sh)
        tokens = out.logits.argmax(-1)
        if self.future is not None:
            self.future[self._ints(fb.batch_size)[5]] = tokens
        return out, tokens

    def _resolved(self, fb: ForwardBatch) -> ForwardBatch:
        """fb with future references among its token ids read from the future buffer (on the device, captured)."""
        if self.future is not None:
            ids = fb.input_ids
            fb = dataclasses.replace(fb, input_ids=torch.where(ids < 0, self.future[(-ids - 1).clamp_min(0)], ids))
        return fb

    def serves(self, bs: int, width: int) -> bool:
        return self.bucket(bs) in self.graphs and width <= self.max_pages

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.mode == ForwardMode.DECODE and fb.mem is self.mem and not fb.capture_layers
                and fb.page_table is not None and self.serves(fb.batch_size, fb.page_table.shape[1]))

    @torch.no_grad()
    def run(self, fb: ForwardBatch):
        """Replay the bucket graph for fb (device tensors); returns the model's ModelOutput restricted to fb's rows
        (views of the graph's static outputs: valid until the next replay)."""
        assert self.can_run(fb), "batch not servable by the captured decode graphs"
        bs = fb.batch_size
        b = self.bucket(bs)
        ints = self._ints(b)
        seq_lens = fb.seq_lens_t if fb.seq_lens_t is not None else torch.tensor(fb.seq_lens)
        for row, src in enumerate((fb.input_ids, fb.positions, fb.state_slots, fb.out_cache_loc, seq_lens)):
            ints[row, :bs].copy_(src, non_blocking=True)
        if self.greedy and self.future is not None:  # the graph's tokens then go nowhere a request reads
            ints[5, :bs].fill_(self.future_scratch)
        self.page_table[:bs, : fb.page_table.shape[1]].copy_(fb.page_table, non_blocking=True)
        if b > bs:
            ints[:, bs:].copy_(self.pad_t.expand(-1, b - bs))
            self.page_table[bs:b].fill_(self.scratch_page)
        self.graphs[b].replay()
        out = self.outputs[b]
        logits = out.logits[:bs] if fb.logits_indices is None else out.logits[fb.logits_indices]
        return type(out)(logits, out.hidden[:bs], {})

    def host_ints(self, columns, bs: int) -> tuple[torch.Tensor, int]:
        """A step's [ROWS, bucket] host integers from its ROWS columns of bs values, padded; and the bucket."""
        b = self.bucket(bs)
        return int_tensor(padded_rows(columns, b, self.pad)).view(len(columns), b), b

    @torch.no_grad()
    def run_host(self, ints: torch.Tensor, table: torch.Tensor, bs: int):
        """Replay from host data: ints [ROWS, bucket] (`host_ints`; negative token ids are future references) and
        table [bucket, width] int32 are copied into the bucket's static inputs (non-blocking copies from pageable
        memory: staged, no stream synchronisation). Returns (the output for the first bs rows, the future-index
        row, the rows' argmax tokens, already in the future buffer, or None without greedy)."""
        b = ints.shape[1]
        static = self._ints(b)
        static.copy_(ints, non_blocking=True)
        self.page_table[:b, : table.shape[1]].copy_(table, non_blocking=True)
        self.graphs[b].replay()
        out = self.outputs[b]
        tokens = self.tokens[b][:bs] if b in self.tokens else None
        return type(out)(out.logits[:bs], out.hidden[:bs], {}), static[5, :bs], tokens


@torch.no_grad()
def capture(fn, pool):
    """Warm up and capture fn() on a side stream into `pool` (None: a new one); returns (graph, output, pool).
    The warm-up runs outside the graph: Triton compiles, cuBLAS picks its kernels, lazy buffers get allocated."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return g, out, pool if pool is not None else g.pool()


class VerifyGraphRunner(_Buckets):
    """CUDA-graph speculative verify: `model(ForwardBatch(VERIFY))` over blocks of one length L, per (batch-size
    bucket, L), captured the first time that pair runs (start-up warms the ones the engine will use).

    The forward reads only device inputs (token ids, positions, cache locations, page table, state slots, the real
    tokens per block, the keys per token), so one graph serves any mix of block lengths up to L. Padding rows verify
    nothing (zero real tokens) on the scratch slot and page. Outputs, the captured feature layers and the per-layer
    replay records are the graph's static tensors: valid until the next replay of the same graph.
    """

    def __init__(self, model, mem, batch_sizes, max_block: int, max_pages_per_seq: int,
                 capture_layers: tuple[int, ...], device: torch.device | str = "cuda"):
        self.model, self.mem = model, mem
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        self.max_block, self.max_pages = max_block, max_pages_per_seq
        self.capture_layers = tuple(capture_layers)
        n = self.batch_sizes[-1]
        T = n * max_block
        dev = torch.device(device)
        self.scratch_page, self.scratch_slot = mem.scratch_page, mem.scratch_slot
        self.scratch_loc = mem.scratch_page * mem.page_size
        self.input_ids = torch.zeros(T, dtype=torch.long, device=dev)
        self.positions = torch.zeros(T, dtype=torch.long, device=dev)
        self.out_cache_loc = torch.full((T,), self.scratch_loc, dtype=torch.long, device=dev)
        self.key_lens = torch.ones(T, dtype=torch.int32, device=dev)
        self.page_table = torch.full((n, max_pages_per_seq), self.scratch_page, dtype=torch.int32, device=dev)
        self.state_slots = torch.full((n,), self.scratch_slot, dtype=torch.long, device=dev)
        self.verify_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.commit = torch.zeros(n, dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], tuple] = {}
        self.fold_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.last: tuple[int, int, int] | None = None  # (batch, bucket, L) of the last replay
        self.pool = None

    def _batch(self, bs: int, L: int) -> ForwardBatch:
        T = bs * L
        return ForwardBatch(ForwardMode.VERIFY, self.input_ids[:T], self.positions[:T], [L] * bs, [0] * bs,
                            mem=self.mem, page_table=self.page_table[:bs], out_cache_loc=self.out_cache_loc[:T],
                            state_slots=self.state_slots[:bs], capture_layers=self.capture_layers,
                            verify_lens_t=self.verify_lens[:bs], key_lens_t=self.key_lens[:T])

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.mode == ForwardMode.VERIFY and fb.mem is self.mem and fb.spec_rollback == "replay"
                and self.bucket(fb.batch_size) is not None and fb.extend_lens[0] <= self.max_block
                and tuple(fb.capture_layers) == self.capture_layers and fb.verify_lens_t is not None
                and fb.key_lens_t is not None and fb.page_table.shape[1] <= self.max_pages)

    def ensure(self, bs: int, L: int) -> None:
        """Capture the graph of (bucket of bs, L) now if it does not exist yet."""
        key = (self.bucket(bs), L)
        if key not in self.graphs:
            self._pad(0, key[0], L)
            fb = self._batch(*key)
            self.graphs[key], out, self.pool = capture(lambda: self.model(fb), self.pool)
            self.outputs[key] = (out, dict(fb.replay))

    def _pad(self, bs: int, b: int, L: int) -> None:
        """Rows bs..b verify nothing: zero real tokens, one key, on the scratch page and slot."""
        if b > bs:
            self.input_ids[bs * L : b * L].zero_()
            self.positions[bs * L : b * L].zero_()
            self.out_cache_loc[bs * L : b * L].fill_(self.scratch_loc)
            self.key_lens[bs * L : b * L].fill_(1)
            self.page_table[bs:b].fill_(self.scratch_page)
            self.state_slots[bs:b].fill_(self.scratch_slot)
            self.verify_lens[bs:b].zero_()

    @torch.no_grad()
    def run(self, fb: ForwardBatch):
        """Replay the graph for fb (capturing it first if needed); returns the ModelOutput of fb's tokens and fills
        fb.replay with its rows of the replay records (views of static tensors)."""
        assert self.can_run(fb), "batch not servable by the verify graphs"
        bs, L = fb.batch_size, fb.extend_lens[0]
        self.ensure(bs, L)
        b = self.bucket(bs)
        T = bs * L
        self.input_ids[:T].copy_(fb.input_ids, non_blocking=True)
        self.positions[:T].copy_(fb.positions, non_blocking=True)
        self.out_cache_loc[:T].copy_(fb.out_cache_loc, non_blocking=True)
        self.key_lens[:T].copy_(fb.key_lens_t, non_blocking=True)
        w = fb.page_table.shape[1]
        self.page_table[:bs, :w].copy_(fb.page_table, non_blocking=True)
        self.state_slots[:bs].copy_(fb.state_slots, non_blocking=True)
        self.verify_lens[:bs].copy_(fb.verify_lens_t, non_blocking=True)
        self._pad(bs, b, L)
        self.graphs[(b, L)].replay()
        self.last = (bs, b, L)
        out, replay = self.outputs[(b, L)]
        fb.replay = {layer: KDAReplay(r.x[:bs], r.k[:bs], r.v[:bs], r.g[:bs], r.beta[:bs])
                     for layer, r in replay.items()}
        return type(out)(out.logits[:T], out.hidden[:T], {layer: c[:T] for layer, c in out.captured.items()})

    @torch.no_grad()
    def ensure_fold(self, bs: int, L: int) -> None:
        """Capture the fold graph of (bucket, L) (and its verify graph) now rather than at its first step: a capture
        mid-serving stalls that step by ~0.4 s on the H200."""
        from kestrel.ops import kda as kda_ops

        self.ensure(bs, L)
        key = (self.bucket(bs), L)
        if key not in self.fold_graphs:
            b = key[0]
            replay = self.outputs[key][1]
            self.commit[:b].zero_()  # the capture's warm-ups commit nothing (a state rewritten with itself)

            def fold_all():
                for layer, rec in replay.items():
                    kda_ops.fold(rec, self.mem.conv_state(layer), self.mem.ssm_state(layer), self.state_slots[:b],
                                 self.commit[:b])

            self.fold_graphs[key], _, self.pool = capture(fold_all, self.pool)

    @torch.no_grad()
    def fold(self, commit: torch.Tensor) -> None:
        """ReplaySSM's fold of the last replayed verify, as a graph of every KDA layer's fold over that graph's
        records (captured on first use unless `ensure_fold` ran): commit [batch] int32 device tensor of steps to
        commit per block."""
        bs, b, L = self.last
        self.ensure_fold(b, L)
        key = (b, L)
        self.commit[:bs].copy_(commit, non_blocking=True)
        self.commit[bs:b].zero_()
        self.fold_graphs[key].replay()


class DraftGraphRunner(_Buckets):
    """CUDA-graph drafting: the drafter's greedy `propose` (block forward + gamma corrections, no distributions)
    per batch-size bucket and confidence on/off, captured on first use. Padding rows draft from zero features."""

    def __init__(self, drafter, batch_sizes, gamma: int, device: torch.device | str = "cuda"):
        self.drafter, self.gamma = drafter, gamma
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        n = self.batch_sizes[-1]
        dev = torch.device(device)
        self.features = torch.zeros(n, drafter.cfg.feature_size, dtype=drafter.fc.weight.dtype, device=dev)
        self.last_token = torch.zeros(n, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, bool], object] = {}
        self.pool = None

    def ensure(self, bs: int, confidence: bool) -> None:
        key = (self.bucket(bs), confidence)
        if key not in self.graphs:
            b = key[0]

            def propose():
                return self.drafter.propose(self.features[:b], self.last_token[:b], self.gamma, want_probs=False,
                                            want_confidence=confidence)

            self.graphs[key], self.outputs[key], self.pool = capture(propose, self.pool)

    @torch.no_grad()
    def run(self, features: torch.Tensor, last_token: torch.Tensor, confidence: bool):
        """DraftOutput (tokens [B, gamma], confidence [B, gamma] or None) as views of the graph's static outputs."""
        bs = features.shape[0]
        self.ensure(bs, confidence)
        b = self.bucket(bs)
        self.features[:bs].copy_(features, non_blocking=True)
        self.last_token[:bs].copy_(last_token, non_blocking=True)
        if b > bs:
            self.features[bs:b].zero_()
            self.last_token[bs:b].zero_()
        self.graphs[(b, confidence)].replay()
        out = self.outputs[(b, confidence)]
        return type(out)(out.tokens[:bs], None, None if out.confidence is None else out.confidence[:bs])


class SpecStepGraphRunner(_Buckets):
    """CUDA graph of a whole greedy speculative step, per batch-size bucket: `step(features [b, F], ints [8, b],
    table [b, max_pages])` (the speculative worker's `greedy_step`: draft, verify, accept, fold, next features) with
    no host synchronisation inside, so a step is one launch and one copy back. Padding rows carry `pad` (a block
    that verifies and commits nothing on the scratch page and slot) and zero features. With `window` > 0 the step
    also takes and returns each request's context window [b, window] (context lookup)."""

    def __init__(self, step, batch_sizes, feature_size: int, dtype: torch.dtype, max_pages_per_seq: int,
                 pad: list[int], scratch_page: int, device: torch.device | str = "cuda", window: int = 0):
        self.step, self.pad, self.scratch_page = step, list(pad), scratch_page
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        self.max_pages = max_pages_per_seq
        n = self.batch_sizes[-1]
        dev = torch.device(device)
        self.features = torch.zeros(n, feature_size, dtype=dtype, device=dev)
        self.ints = torch.zeros(len(pad) * n, dtype=torch.long, device=dev)
        self.table = torch.full((n, max_pages_per_seq), scratch_page, dtype=torch.int32, device=dev)
        self.windows = torch.full((n, window), -1, dtype=torch.long, device=dev) if window else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple] = {}
        self.pool = None
        self.launch_out: torch.Tensor | None = None  # the packed results of a launch's steps (`keep_packed`)

    def _ints(self, b: int) -> torch.Tensor:
        return self.ints[: len(self.pad) * b].view(len(self.pad), b)

    def keep_packed(self, k: int, packed: torch.Tensor) -> torch.Tensor:
        """Copy step k's packed result [b, G + 2] of a launch of several steps aside (the next replay overwrites the
        graph's output), queued on the stream."""
        if self.launch_out is None:
            self.launch_out = torch.empty(MAX_LAUNCH_STEPS, self.batch_sizes[-1], packed.shape[1], dtype=packed.dtype,
                                          device=packed.device)
        return self.launch_out[k, : packed.shape[0]].copy_(packed)

    def kept_packed(self, steps: int, b: int) -> torch.Tensor:
        """The packed results `keep_packed` set aside for a launch's `steps` steps: [steps, b, G + 2]."""
        return self.launch_out[:steps, :b]

    @torch.no_grad()
    def ensure(self, bs: int) -> None:
        b = self.bucket(bs)
        if b not in self.graphs:
            self._ints(b).copy_(torch.tensor(self.pad).view(-1, 1).expand(-1, b))
            self.table[:b].fill_(self.scratch_page)
            self.features[:b].zero_()
            windows = None if self.windows is None else self.windows[:b]

            def step():
                # the next features and windows also go to the input rows: a chained step finds them there
                packed, feats, win = self.step(self.features[:b], self._ints(b), self.table[:b], windows=windows)
                self.features[:b].copy_(feats)
                if win is not None:
                    windows.copy_(win)
                return packed, feats, win

            self.graphs[b], self.outputs[b], self.pool = capture(step, self.pool)

    @torch.no_grad()
    def run(self, features: list[torch.Tensor], ints: torch.Tensor, table: torch.Tensor | None,
            windows: list[torch.Tensor] | None = None) -> tuple:
        """features (and windows, with a window): one tensor per request, or None where the input rows already hold
        them (the graph writes each step's next features and windows there: a step serving the requests of the step
        before, in its order); ints [8, bucket] and table [bucket, width] host tensors already padded to the bucket
        (table None: the one of the replay before, a later step of the same launch). Returns the graph's static
        outputs (valid until its next replay)."""
        b = ints.shape[1]
        assert self.bucket(b) == b and (table is None or (table.shape[0] == b and table.shape[1] <= self.max_pages))
        self.ensure(b)
        if features is not None:
            bs = len(features)
            torch.stack(features, out=self.features[:bs])
            if b > bs:
                self.features[bs:b].zero_()
        if self.windows is not None and windows is not None:
            torch.stack(windows, out=self.windows[: len(windows)])
        self._ints(b).copy_(ints, non_blocking=True)
        if table is not None:
            self.table[:b, : table.shape[1]].copy_(table, non_blocking=True)
        self.graphs[b].replay()
        return self.outputs[b]
