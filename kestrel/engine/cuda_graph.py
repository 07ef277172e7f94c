"""CUDA-graph decode: one captured `model(ForwardBatch(DECODE))` per batch-size bucket, replayed with padding.

Each bucket's graph reads static input buffers (token ids, positions, page table, state slots, sequence lengths,
cache locations); `run` copies a batch into them, pads up to the bucket with rows that point at the memory's
scratch page and scratch state slot (never handed out, so padded rows read and write harmlessly), replays, and slices
the real rows out of the static outputs. The captured forward must do no host synchronisation and read no host
values that change between steps: decode kernels read `fb.seq_lens_t`, never `fb.seq_lens`.
"""

import torch

from kestrel.models.forward_batch import ForwardBatch, ForwardMode

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class DecodeGraphRunner:
    def __init__(self, model, mem, batch_sizes=DEFAULT_BATCH_SIZES, max_pages_per_seq: int = 64,
                 device: torch.device | str = "cuda"):
        self.model, self.mem = model, mem
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        self.max_pages = max_pages_per_seq
        n = self.batch_sizes[-1]
        dev = torch.device(device)
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.scratch_page, self.scratch_slot = mem.scratch_page, mem.scratch_slot
        self.scratch_loc = mem.scratch_page * mem.page_size
        self.page_table = torch.full((n, max_pages_per_seq), self.scratch_page, dtype=torch.int32, device=dev)
        self.state_slots = torch.full((n,), self.scratch_slot, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.out_cache_loc = torch.full((n,), self.scratch_loc, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, object] = {}
        self.pool = None

    def _batch(self, bs: int) -> ForwardBatch:
        """The static ForwardBatch of a bucket. prefix_lens are placeholders: no captured code may read them."""
        return ForwardBatch(ForwardMode.DECODE, self.input_ids[:bs], self.positions[:bs], [1] * bs, [0] * bs,
                            mem=self.mem, page_table=self.page_table[:bs], out_cache_loc=self.out_cache_loc[:bs],
                            state_slots=self.state_slots[:bs], seq_lens_t=self.seq_lens[:bs])

    @torch.no_grad()
    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool. Padding rows point at scratch page/slot 0,
        and the scratch slot is overwritten by the warm-up, so capture changes no live request's state."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.batch_sizes):
                fb = self._batch(bs)
                # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels, lazy buffers get allocated
                self.model(fb)
                self.model(fb)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=stream):
                    self.outputs[bs] = self.model(fb)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[bs] = g
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def bucket(self, bs: int) -> int | None:
        return next((b for b in self.batch_sizes if b >= bs), None)

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.mode == ForwardMode.DECODE and fb.mem is self.mem and not fb.capture_layers
                and self.bucket(fb.batch_size) in self.graphs and fb.page_table is not None
                and fb.page_table.shape[1] <= self.max_pages)

    @torch.no_grad()
    def run(self, fb: ForwardBatch):
        """Replay the bucket graph for fb; returns the model's ModelOutput restricted to fb's rows (views of the
        graph's static outputs: valid until the next replay)."""
        assert self.can_run(fb), "batch not servable by the captured decode graphs"
        bs = fb.batch_size
        b = self.bucket(bs)
        self.input_ids[:bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:bs].copy_(fb.positions, non_blocking=True)
        self.state_slots[:bs].copy_(fb.state_slots, non_blocking=True)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc, non_blocking=True)
        w = fb.page_table.shape[1]
        self.page_table[:bs, :w].copy_(fb.page_table, non_blocking=True)
        if fb.seq_lens_t is not None:
            self.seq_lens[:bs].copy_(fb.seq_lens_t, non_blocking=True)
        else:
            self.seq_lens[:bs].copy_(torch.tensor(fb.seq_lens, dtype=torch.int32), non_blocking=True)
        if b > bs:
            # padding rows: token 0 at position 0 of the scratch page / scratch state slot, one key
            self.input_ids[bs:b].zero_()
            self.positions[bs:b].zero_()
            self.state_slots[bs:b].fill_(self.scratch_slot)
            self.out_cache_loc[bs:b].fill_(self.scratch_loc)
            self.page_table[bs:b].fill_(self.scratch_page)
            self.seq_lens[bs:b].fill_(1)
        self.graphs[b].replay()
        out = self.outputs[b]
        logits = out.logits[:bs] if fb.logits_indices is None else out.logits[fb.logits_indices]
        return type(out)(logits, out.hidden[:bs], {})
