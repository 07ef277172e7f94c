"""The one per-batch metadata object every layer reads: mode, positions, page tables, state slots.

Layers never read module globals: the model runner builds a ForwardBatch for each forward, and a layer finds its
MLA cache pages and KDA state slots through `fb.mem` by its own layer id.
"""

import enum
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kestrel.ops import host_ints


class ForwardMode(enum.Enum):
    # one or more new tokens per sequence (prefill, chunked prefill, mixed prefill + decode); state committed
    EXTEND = "extend"
    # exactly one new token per sequence; state committed
    DECODE = "decode"
    # speculative verify: a block of tokens per sequence, every block padded to one length (extend_lens all equal,
    # verify_lens_t the real tokens); the KDA state is read, not written (ReplaySSM folds later). The uniform layout
    # needs no host values inside the forward, so a verify step can be a CUDA graph.
    VERIFY = "verify"


class MemoryViews(Protocol):
    """What the model needs from the memory pools: per-layer tensor views indexed by page / slot."""

    page_size: int

    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        """[num_pages, page_size, kv_lora_rank + qk_rope_head_dim] for MLA layer `layer_id`."""

    def conv_state(self, layer_id: int) -> torch.Tensor:
        """[num_slots, conv_width - 1, 3 * heads * head_dim] for KDA layer `layer_id`."""

    def ssm_state(self, layer_id: int) -> torch.Tensor:
        """[num_slots, heads, head_dim, head_dim] for KDA layer `layer_id`, in the state dtype."""


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] all new tokens, sequences packed back to back
    positions: torch.Tensor  # [T] absolute position of each new token
    extend_lens: list[int]  # new tokens per sequence
    prefix_lens: list[int]  # tokens already in the cache per sequence
    # None: a stateless forward over whole sequences (the reference and training path)
    mem: MemoryViews | None = None
    # [B, max_pages] page ids covering every position < seq_len: int32 (the kernels), int32 or int64 on a CPU
    page_table: torch.Tensor | None = None
    out_cache_loc: torch.Tensor | None = None  # [T] flat cache slot (page * page_size + offset) per new token
    state_slots: torch.Tensor | None = None  # [B] working KDA state slot per sequence
    # per sequence: (tokens of this extend after which to snapshot, destination slot) or None
    track: list[tuple[int, int] | None] | None = None
    # rows of the packed tokens to turn into logits; None = every token
    logits_indices: torch.Tensor | None = None
    # a stateless training forward over equal-length sequences: KDA uses the factored chunk form (bounded safe
    # gates only) and attention runs batched; results match the reference up to rounding
    training: bool = False
    # device copy of seq_lens for decode kernels (CUDA graphs cannot build it mid-capture); None = built on demand
    seq_lens_t: torch.Tensor | None = None
    # layers whose output hidden states the caller wants back (speculative drafting features)
    capture_layers: tuple[int, ...] = ()
    # filled during the forward for VERIFY mode: per KDA layer, the raw step inputs ReplaySSM folds later
    replay: dict = field(default_factory=dict)
    # VERIFY: "replay" stores step inputs (~1 KB per head and step), "snapshot" the state after every step (the
    # baseline ReplaySSM is measured against)
    spec_rollback: str = "replay"
    # VERIFY: real tokens per block [B] int32 (the rest of each block is padding: no-op KDA steps, keys never read,
    # latents written to the scratch page) and the keys each token attends to [T] int32 (prefix + its index + 1,
    # clamped to the block's real tokens)
    verify_lens_t: torch.Tensor | None = None
    key_lens_t: torch.Tensor | None = None

    def __post_init__(self):
        assert len(self.extend_lens) == len(self.prefix_lens), "extend_lens and prefix_lens differ in length"
        assert sum(self.extend_lens) == self.input_ids.numel(), "extend_lens do not add up to the tokens"

    def split_decode_rows(self) -> tuple[list[int], list[int]] | None:
        """For a mixed EXTEND batch with a cache: (rows that are plain decodes, the other rows), or None when the
        batch is not mixed. Decode rows (one new token after a cached prefix, no mid-extend snapshot) can take the
        batched decode kernels instead of being padded to the longest prefill chunk."""
        if self.mode != ForwardMode.EXTEND or self.mem is None:
            return None
        dec = [i for i, (n, p) in enumerate(zip(self.extend_lens, self.prefix_lens))
               if n == 1 and p > 0 and (self.track is None or self.track[i] is None)]
        if not dec or len(dec) == self.batch_size:
            return None
        dec_set = set(dec)
        return dec, [i for i in range(self.batch_size) if i not in dec_set]

    def subset(self, rows: list[int]) -> tuple["ForwardBatch", torch.Tensor]:
        """The metadata of some rows as their own batch, and the indices of their tokens in this batch's packing."""
        cu = self.cu_seqlens
        dev = self.input_ids.device
        tok = host_ints([t for i in rows for t in range(cu[i], cu[i + 1])], dev)
        idx = host_ints(rows, dev)
        mode = ForwardMode.DECODE if all(self.extend_lens[i] == 1 for i in rows) else self.mode
        sub = ForwardBatch(
            mode, self.input_ids[tok], self.positions[tok], [self.extend_lens[i] for i in rows],
            [self.prefix_lens[i] for i in rows], mem=self.mem,
            page_table=None if self.page_table is None else self.page_table[idx],
            out_cache_loc=None if self.out_cache_loc is None else self.out_cache_loc[tok],
            state_slots=None if self.state_slots is None else self.state_slots[idx],
            track=None if self.track is None else [self.track[i] for i in rows],
            seq_lens_t=None if self.seq_lens_t is None else self.seq_lens_t[idx])
        return sub, tok

    def seq_lens_tensor(self) -> torch.Tensor:
        """Keys per sequence on the device: seq_lens_t (CUDA graphs cannot build it from the host list mid-capture:
        runners pass it), else built from the host list."""
        if self.seq_lens_t is not None:
            return self.seq_lens_t
        return host_ints(self.seq_lens, self.input_ids.device)

    def verify_key_lens(self) -> torch.Tensor:
        """VERIFY: keys per token [T] on the device: key_lens_t, else built from the host lists (no padding unless
        verify_lens_t says so)."""
        if self.key_lens_t is not None:
            return self.key_lens_t
        L = self.extend_lens[0]
        lens = self.extend_lens if self.verify_lens_t is None else self.verify_lens_t.tolist()
        keys = [p + min(i, n - 1) + 1 for p, n in zip(self.prefix_lens, lens) for i in range(L)]
        return host_ints(keys, self.input_ids.device, torch.int32)

    @property
    def equal_lengths(self) -> bool:
        return len(set(self.extend_lens)) <= 1

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def cu_seqlens(self) -> list[int]:
        cu = [0]
        for n in self.extend_lens:
            cu.append(cu[-1] + n)
        return cu

    @classmethod
    def full_sequences(cls, sequences: list[list[int]] | torch.Tensor, device=None) -> "ForwardBatch":
        """A stateless forward over whole sequences from position 0: the single-request reference."""
        if isinstance(sequences, torch.Tensor) and sequences.dim() == 2:
            # an equal-length batch (training): no trip through Python lists
            B, L = sequences.shape
            pos = torch.arange(L, device=sequences.device).repeat(B)
            return cls(ForwardMode.EXTEND, sequences.reshape(-1), pos, [L] * B, [0] * B)
        if isinstance(sequences, torch.Tensor):
            sequences = [sequences.tolist()]
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=device)
        pos = torch.tensor([i for s in sequences for i in range(len(s))], dtype=torch.long, device=device)
        return cls(ForwardMode.EXTEND, ids, pos, [len(s) for s in sequences], [0] * len(sequences))
