"""Static memory pools: a paged MLA latent-KV pool and a KDA state-slot pool.

Index 0 of each pool is a scratch page / slot that is never handed out: padded batches (CUDA graphs) read and
write it harmlessly. Both pools expose the per-layer tensor views the model reads through `MemoryViews`.
"""

import heapq

import torch

from kestrel.models.config import K3Config
from kestrel.ops.kda.reference import state_dtype_for


class OutOfMemory(RuntimeError):
    """A pool has too few free pages or slots; the scheduler retracts or evicts and tries again."""


class FreeList:
    """Integer ids 1..n-1 (0 is scratch) handed out lowest first, so runs are reproducible."""

    def __init__(self, n: int):
        self.capacity = n - 1
        self._free = list(range(1, n))  # a min-heap (sorted is a valid heap)
        self._used: set[int] = set()

    def alloc(self, count: int = 1) -> list[int]:
        if count > len(self._free):
            raise OutOfMemory(f"need {count}, {len(self._free)} free")
        ids = [heapq.heappop(self._free) for _ in range(count)]
        self._used.update(ids)
        return ids

    def free(self, ids) -> None:
        ids = list(ids)
        if not self._used.issuperset(ids) or len(set(ids)) != len(ids):  # checked before anything changes
            seen: set[int] = set()
            for i in ids:
                if i not in self._used or i in seen:
                    raise AssertionError(f"double free or foreign id {i}")
                seen.add(i)
        self._used.difference_update(ids)
        for i in ids:
            heapq.heappush(self._free, i)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> set[int]:
        return self._used

    def check(self, name: str) -> None:
        assert len(self._free) == len(set(self._free)), f"{name}: duplicate free ids"
        assert not (set(self._free) & self._used), f"{name}: id both free and used"
        assert len(self._free) + len(self._used) == self.capacity, f"{name}: ids lost"


class KVPool:
    """Paged latent cache, one [num_pages, page_size, latent] tensor per MLA layer."""

    def __init__(self, cfg: K3Config, num_pages: int, page_size: int, dtype, device):
        assert page_size >= 1
        self.page_size, self.num_pages = page_size, num_pages
        self.pages = FreeList(num_pages)
        self.buffers = {l: torch.zeros(num_pages, page_size, cfg.kv_latent_dim, dtype=dtype, device=device)
                        for l in cfg.mla_layer_ids}

    def bytes_per_page(self) -> int:
        return sum(b[0].numel() * b.element_size() for b in self.buffers.values())


class StatePool:
    """KDA state slots: per KDA layer a conv tail [slots, W - 1, 3HK] and a recurrent state [slots, H, K, K]."""

    def __init__(self, cfg: K3Config, num_slots: int, dtype, device):
        self.num_slots = num_slots
        self.slots = FreeList(num_slots)
        H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
        sdt = state_dtype_for(dtype)
        self.conv = {l: torch.zeros(num_slots, W - 1, cfg.conv_dim, dtype=dtype, device=device) for l in cfg.kda_layer_ids}
        self.ssm = {l: torch.zeros(num_slots, H, K, K, dtype=sdt, device=device) for l in cfg.kda_layer_ids}

    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for d in (self.conv, self.ssm) for t in d.values())

    def copy(self, src: int, dst: int) -> None:
        """Copy one slot's whole state (all layers) on the current stream."""
        for d in (self.conv, self.ssm):
            for t in d.values():
                t[dst].copy_(t[src])

    def poison(self, slot: int) -> None:
        """Fill a slot with NaN so that a forward which reads it without a restore fails loudly (tests)."""
        for d in (self.conv, self.ssm):
            for t in d.values():
                t[slot].fill_(float("nan"))


class Memory:
    """Static pools behind the interface the memory manager and the model use.

    Requests and the cache hold logical page and slot ids; the model reads physical ones. Here they coincide;
    the unified pool (mem/unified.py) moves blocks and keeps a table. Frees return the memory operations they
    imply (none here), which the manager logs for the forward stream.
    """

    scratch_page = 0
    scratch_slot = 0
    # page moves so far (physical page ids never change here; the unified pool counts its moves)
    page_epoch = 0

    def __init__(self, kv: KVPool, state: StatePool):
        self.kv, self.state = kv, state
        self.page_size = kv.page_size

    def release(self) -> None:
        """Drop the device buffers (at shutdown; the allocators' counts stay readable)."""
        self.kv.buffers.clear()
        self.state.conv.clear()
        self.state.ssm.clear()

    def device_bytes(self) -> int:
        tensors = [*self.kv.buffers.values(), *self.state.conv.values(), *self.state.ssm.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ---- views the model reads, indexed by physical id
    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv.buffers[layer_id]

    def conv_state(self, layer_id: int) -> torch.Tensor:
        return self.state.conv[layer_id]

    def ssm_state(self, layer_id: int) -> torch.Tensor:
        return self.state.ssm[layer_id]

    # ---- allocation, by logical id
    @property
    def num_free_pages(self) -> int:
        return self.kv.pages.num_free

    @property
    def num_free_slots(self) -> int:
        return self.state.slots.num_free

    def alloc_pages(self, n: int) -> list[int]:
        return self.kv.pages.alloc(n)

    def alloc_slot(self) -> int:
        return self.state.slots.alloc(1)[0]

    def free_pages(self, ids) -> list[tuple]:
        self.kv.pages.free(ids)
        return []

    def free_slot(self, slot: int) -> tuple[list[tuple], int]:
        """Returns (operations, the physical block that is now free)."""
        self.state.slots.free([slot])
        return [], slot

    def shortfall(self, pages: int, slots: int) -> tuple[int, int]:
        """How many pages and slots the cache must give back before `pages` and `slots` fit (0, 0: they fit)."""
        return max(0, pages - self.num_free_pages), max(0, slots - self.num_free_slots)

    # ---- translation and execution
    def page_phys(self, ids: list[int]) -> list[int]:
        return list(ids)

    def slot_phys(self, slot: int) -> int:
        return slot

    def run(self, op: tuple) -> None:
        """Execute one logged memory operation on the current stream."""
        kind = op[0]
        if kind == "copy_slot":
            self.state.copy(op[1], op[2])
        elif kind == "poison_slot":
            self.state.poison(op[1])
        else:
            raise ValueError(f"unknown memory operation {op!r}")

    def usage(self) -> dict:
        ps, ss = self.kv.bytes_per_page(), self.state.bytes_per_slot()
        return {"kv_bytes_used": len(self.kv.pages.used) * ps, "state_bytes_used": len(self.state.slots.used) * ss,
                "total_bytes": self.kv.num_pages * ps + self.state.num_slots * ss}

    def check(self) -> None:
        self.kv.pages.check("kv pages")
        self.state.slots.check("state slots")
