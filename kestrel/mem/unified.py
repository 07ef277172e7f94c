"""Unified memory: one byte pool for KDA state blocks and MLA KV pages (`--enable-unified-memory`).

State blocks (all KDA layers of one slot) fill from the low end, KV pages (all MLA layers of `page_size`
tokens) from the high end; the bytes between are one free region either side can take, so capacity is decided
by the workload rather than by a ratio chosen at start-up. Freeing a block in the middle of its region moves the
region's boundary block into the hole: the data is copied (an operation logged for the forward stream) and the
logical -> physical table changes, so requests and the prefix cache, which hold logical ids, never notice. A
pinned block (in use by an asynchronous copy or transfer) is never moved: its hole stays until it is unpinned.

Physical layout (bytes): [scratch state block | state blocks ...  free  ... KV pages | scratch KV page].
"""

from dataclasses import dataclass

import torch

from kestrel.mem.pools import OutOfMemory
from kestrel.models.config import K3Config
from kestrel.ops.kda.reference import state_dtype_for

ALIGN = 256


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


class _Side:
    """One kind of block (pages or slots) of the unified pool, behind the FreeList interface."""

    def __init__(self, pool: "UnifiedPool", kind: str):
        self.pool, self.kind = pool, kind
        self.table: dict[int, int] = {}  # logical id -> physical position
        self.next_id = 1

    @property
    def used(self) -> set[int]:
        return set(self.table)

    @property
    def capacity(self) -> int:
        return self.pool.capacity(self.kind)

    @property
    def num_free(self) -> int:
        return self.pool.num_free(self.kind)

    def alloc(self, count: int = 1) -> list[int]:
        return [self.pool.alloc(self.kind) for _ in range(count)]

    def free(self, ids) -> None:
        for i in ids:
            self.pool.free(self.kind, i)

    def check(self, name: str) -> None:
        self.pool.check()


@dataclass(frozen=True)
class BlockLayout:
    """Byte offsets of every layer inside a state block and a KV page."""

    slot_bytes: int
    page_bytes: int
    ssm_off: dict
    conv_off: dict
    kv_off: dict

    @classmethod
    def of(cls, cfg: K3Config, page_size: int, dtype) -> "BlockLayout":
        H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
        esz, ssz = torch.finfo(dtype).bits // 8, torch.finfo(state_dtype_for(dtype)).bits // 8
        # recurrent states first (the widest dtype), then conv tails
        ssm_off, conv_off, kv_off, off = {}, {}, {}, 0
        for l in cfg.kda_layer_ids:
            ssm_off[l], off = off, off + _round_up(H * K * K * ssz, 64)
        for l in cfg.kda_layer_ids:
            conv_off[l], off = off, off + _round_up((W - 1) * cfg.conv_dim * esz, 64)
        slot_bytes, off = _round_up(max(off, 1)), 0
        for l in cfg.mla_layer_ids:
            kv_off[l], off = off, off + _round_up(page_size * cfg.kv_latent_dim * esz, 64)
        return cls(slot_bytes, _round_up(max(off, 1)), ssm_off, conv_off, kv_off)


def unified_bytes(cfg: K3Config, tokens: int, slots: int, page_size: int, dtype) -> int:
    """The bytes two static pools of `tokens` KV tokens and `slots` state slots take (scratch blocks included)."""
    lay = BlockLayout.of(cfg, page_size, dtype)
    return (-(-tokens // page_size) + 1) * lay.page_bytes + slots * lay.slot_bytes


class UnifiedPool:
    def __init__(self, cfg: K3Config, total_bytes: int, page_size: int, dtype, device):
        sdt = state_dtype_for(dtype)
        H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
        lay = BlockLayout.of(cfg, page_size, dtype)
        self.slot_bytes, self.page_bytes = lay.slot_bytes, lay.page_bytes
        self.ssm_off, self.conv_off, self.kv_off = lay.ssm_off, lay.conv_off, lay.kv_off
        self.num_page_pos = total_bytes // self.page_bytes
        self.total = self.num_page_pos * self.page_bytes
        self.num_slot_pos = self.total // self.slot_bytes
        if self.total < self.page_bytes + self.slot_bytes:
            raise ValueError(f"a unified pool of {total_bytes} bytes holds no block beyond the scratch ones")
        self.buf = torch.zeros(self.total, dtype=torch.uint8, device=device)
        self.dtype, self.sdt, self.page_size = dtype, sdt, page_size
        self.shapes = {"ssm": (H, K, K), "conv": (W - 1, cfg.conv_dim), "kv": (page_size, cfg.kv_latent_dim)}
        # regions: state blocks at positions [0, n_state), KV pages at [num_page_pos - n_kv, num_page_pos);
        # position 0 and the top page are scratch (never handed out)
        self.n_state, self.n_kv = 1, 1
        self.holes = {"slot": set(), "page": set()}
        self.page_moves = 0  # KV page blocks moved so far: a request's physical page ids may have changed
        self.pinned = {"slot": set(), "page": set()}
        self.sides = {"slot": _Side(self, "slot"), "page": _Side(self, "page")}
        self.ops: list[tuple] = []  # moves for the forward stream, in decision order

    # ---- views (physical positions)
    def _view(self, count: int, stride: int, off: int, dtype, shape) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * (torch.finfo(dtype).bits // 8)
        return self.buf[: count * stride].view(count, stride)[:, off : off + nbytes].view(dtype).view(count, *shape)

    def ssm_view(self, layer: int) -> torch.Tensor:
        return self._view(self.num_slot_pos, self.slot_bytes, self.ssm_off[layer], self.sdt, self.shapes["ssm"])

    def conv_view(self, layer: int) -> torch.Tensor:
        return self._view(self.num_slot_pos, self.slot_bytes, self.conv_off[layer], self.dtype, self.shapes["conv"])

    def kv_view(self, layer: int) -> torch.Tensor:
        return self._view(self.num_page_pos, self.page_bytes, self.kv_off[layer], self.dtype, self.shapes["kv"])

    def slot_block(self, pos: int) -> torch.Tensor:
        return self.buf[pos * self.slot_bytes : (pos + 1) * self.slot_bytes]

    def page_block(self, pos: int) -> torch.Tensor:
        return self.buf[pos * self.page_bytes : (pos + 1) * self.page_bytes]

    # ---- accounting
    @property
    def state_end(self) -> int:
        """First byte after the state region."""
        return self.n_state * self.slot_bytes

    @property
    def kv_start(self) -> int:
        return (self.num_page_pos - self.n_kv) * self.page_bytes

    @property
    def free_bytes(self) -> int:
        return self.kv_start - self.state_end

    def _size(self, kind: str) -> int:
        return self.slot_bytes if kind == "slot" else self.page_bytes

    def num_free(self, kind: str) -> int:
        return self.free_bytes // self._size(kind) + len(self.holes[kind])

    def capacity(self, kind: str) -> int:
        return (self.total - self.slot_bytes - self.page_bytes) // self._size(kind)

    # ---- allocation
    def alloc(self, kind: str) -> int:
        side = self.sides[kind]
        if self.holes[kind]:
            pos = min(self.holes[kind])
            self.holes[kind].remove(pos)
        elif self.free_bytes < self._size(kind):
            raise OutOfMemory(f"unified pool: {self.free_bytes} free bytes, a {kind} needs {self._size(kind)}")
        elif kind == "slot":
            pos, self.n_state = self.n_state, self.n_state + 1
        else:
            self.n_kv += 1
            pos = self.num_page_pos - self.n_kv
        lid = side.next_id
        side.next_id += 1
        side.table[lid] = pos
        return lid

    def _boundary(self, kind: str) -> int:
        """The block next to the free region on this side."""
        return self.n_state - 1 if kind == "slot" else self.num_page_pos - self.n_kv

    def free(self, kind: str, lid: int) -> int:
        """Free logical block lid; returns the physical position that ends up free (for poisoning)."""
        side = self.sides[kind]
        assert lid in side.table, f"double free or foreign {kind} id {lid}"
        pos = side.table.pop(lid)
        self.holes[kind].add(pos)
        return self._compact(kind, pos)

    def _compact(self, kind: str, freed: int) -> int:
        """Move boundary blocks into holes until the free region is contiguous again (or a pin stops it)."""
        side, last_free = self.sides[kind], freed
        while self.holes[kind]:
            edge = self._boundary(kind)
            if edge in self.holes[kind]:  # the boundary itself is free: just shrink the region
                self.holes[kind].remove(edge)
            else:
                if edge in self.pinned[kind]:
                    break
                owner = next(l for l, p in side.table.items() if p == edge)
                hole = min(self.holes[kind]) if kind == "slot" else max(self.holes[kind])
                self.holes[kind].remove(hole)
                side.table[owner] = hole
                self.ops.append(("move_" + kind, edge, hole))
                self.page_moves += kind == "page"
            last_free = edge
            if kind == "slot":
                self.n_state -= 1
            else:
                self.n_kv -= 1
        return last_free

    def pin(self, kind: str, lid: int) -> None:
        self.pinned[kind].add(self.sides[kind].table[lid])

    def unpin(self, kind: str, lid: int) -> None:
        self.pinned[kind].discard(self.sides[kind].table[lid])
        if self.holes[kind]:
            self._compact(kind, -1)

    def take_ops(self) -> list[tuple]:
        out, self.ops = self.ops, []
        return out

    def check(self) -> None:
        assert self.state_end <= self.kv_start, "state and KV regions overlap"
        for kind, lo, hi in (("slot", 1, self.n_state), ("page", self.num_page_pos - self.n_kv, self.num_page_pos - 1)):
            live = list(self.sides[kind].table.values())
            assert len(live) == len(set(live)), f"two {kind}s share a position"
            assert all(lo <= p < hi for p in live), f"a {kind} outside its region"
            assert not (set(live) & self.holes[kind]), f"a live {kind} in a hole"
            assert len(live) + len(self.holes[kind]) == hi - lo, f"{kind} region has unaccounted positions"
            assert not self.holes[kind] or self.pinned[kind], f"{kind} holes without a pin to explain them"


class UnifiedMemory:
    """The memory interface (see pools.Memory) over one UnifiedPool."""

    scratch_slot = 0

    def __init__(self, cfg: K3Config, total_bytes: int, page_size: int, dtype, device):
        self.pool = pool = UnifiedPool(cfg, total_bytes, page_size, dtype, device)
        self.page_size = page_size
        self.scratch_page = pool.num_page_pos - 1
        self.kv = _KVFacade(pool)
        self.state = _StateFacade(pool)
        self._kv = {l: pool.kv_view(l) for l in cfg.mla_layer_ids}
        self._conv = {l: pool.conv_view(l) for l in cfg.kda_layer_ids}
        self._ssm = {l: pool.ssm_view(l) for l in cfg.kda_layer_ids}

    def release(self) -> None:
        """Drop the byte pool and its views (at shutdown; the allocators' counts stay readable)."""
        self.pool.buf = self.pool.buf.new_empty(0)
        for views in (self._kv, self._conv, self._ssm):
            views.clear()

    def device_bytes(self) -> int:
        return self.pool.buf.numel()

    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self._kv[layer_id]

    def conv_state(self, layer_id: int) -> torch.Tensor:
        return self._conv[layer_id]

    def ssm_state(self, layer_id: int) -> torch.Tensor:
        return self._ssm[layer_id]

    @property
    def num_free_pages(self) -> int:
        return self.pool.num_free("page")

    @property
    def num_free_slots(self) -> int:
        return self.pool.num_free("slot")

    def alloc_pages(self, n: int) -> list[int]:
        if n * self.pool.page_bytes > self.pool.free_bytes + len(self.pool.holes["page"]) * self.pool.page_bytes:
            raise OutOfMemory(f"unified pool: {n} pages do not fit in {self.pool.free_bytes} free bytes")
        return [self.pool.alloc("page") for _ in range(n)]

    def alloc_slot(self) -> int:
        return self.pool.alloc("slot")

    def free_pages(self, ids) -> list[tuple]:
        for i in ids:
            self.pool.free("page", i)
        return self.pool.take_ops()

    def free_slot(self, slot: int) -> tuple[list[tuple], int]:
        freed = self.pool.free("slot", slot)
        return self.pool.take_ops(), freed

    def shortfall(self, pages: int, slots: int) -> tuple[int, int]:
        """One budget for both: the bytes missing, expressed as pages to evict (KV is what the cache frees first)
        and, if the cache has no KV to give, as state slots."""
        p = self.pool
        short = pages * p.page_bytes + slots * p.slot_bytes - p.free_bytes
        if short <= 0:
            return 0, 0
        return -(-short // p.page_bytes), -(-short // p.slot_bytes)

    @property
    def page_epoch(self) -> int:
        """Changes whenever a page's physical id may have (see Memory.page_epoch)."""
        return self.pool.page_moves

    def page_phys(self, ids: list[int]) -> list[int]:
        table = self.pool.sides["page"].table
        return [table[i] for i in ids]

    def slot_phys(self, slot: int) -> int:
        return self.pool.sides["slot"].table[slot]

    def run(self, op: tuple) -> None:
        kind, p = op[0], self.pool
        if kind in ("copy_slot", "move_slot"):
            p.slot_block(op[2]).copy_(p.slot_block(op[1]))
        elif kind == "move_page":
            p.page_block(op[2]).copy_(p.page_block(op[1]))
        elif kind == "poison_slot":
            for views in (self._conv, self._ssm):
                for t in views.values():
                    t[op[1]].fill_(float("nan"))
        else:
            raise ValueError(f"unknown memory operation {op!r}")

    def usage(self) -> dict:
        p = self.pool
        return {"kv_bytes_used": (p.n_kv - 1) * p.page_bytes, "state_bytes_used": (p.n_state - 1) * p.slot_bytes,
                "total_bytes": p.total, "free_bytes": p.free_bytes}

    def check(self) -> None:
        self.pool.check()


class _KVFacade:
    def __init__(self, pool: UnifiedPool):
        self.pool, self.pages = pool, pool.sides["page"]
        self.page_size = pool.page_size
        self.num_pages = pool.num_page_pos

    def bytes_per_page(self) -> int:
        return self.pool.page_bytes


class _StateFacade:
    def __init__(self, pool: UnifiedPool):
        self.pool, self.slots = pool, pool.sides["slot"]
        self.num_slots = pool.num_slot_pos

    def bytes_per_slot(self) -> int:
        return self.pool.slot_bytes
