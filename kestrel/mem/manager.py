"""The memory manager: hands out KV pages and KDA state slots to requests, and takes them back.

Ownership is exact: every page and slot other than the scratch ones is free, privately owned by one request,
or owned by the prefix cache; `check_invariants` proves it after every step in tests. When a pool runs short the
cache is asked to evict before allocation fails.
"""

from kestrel.engine.request import Req
from kestrel.mem.pools import Memory, OutOfMemory


class NoCache:
    """The prefix-cache policy of `--disable-radix-cache`: nothing is kept, nothing is matched.

    It also documents the interface the scheduler drives (RadixCache implements the same methods):
    match / unmatch at admission, movements per scheduled forward, release at finish or retraction, evict on
    shortage, owned + check_invariants for the ownership proof.
    """

    slots_per_request = 1

    def match(self, req: Req, mm: "MemoryManager") -> int:
        """Borrow the longest reusable cached prefix of req; returns its length (req.computed_len moves to it)."""
        return 0

    def unmatch(self, req: Req, mm: "MemoryManager") -> None:
        """Undo `match` when admission fails after all."""

    def movements(self, req: Req, new_tokens: int, mm: "MemoryManager") -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """State movements for req's next forward: (restore src -> dst before it, snapshot (offset, slot) in it)."""
        return None, None

    def after_forward(self, req: Req, mm: "MemoryManager") -> None:
        """Bookkeeping once req's forward is submitted (donations: ownership moves, no bytes)."""

    def chunk_limit(self, req: Req) -> int | None:
        """An upper bound on req's next prefill chunk (to end it where a snapshot is wanted), or None."""
        return None

    def spec_snapshot(self, req: Req, max_steps: int, mm: "MemoryManager") -> tuple[int, int] | None:
        """A verify step may commit up to max_steps tokens: (steps, slot) where its fold should leave a snapshot."""
        return None

    def spec_after(self, req: Req, taken: bool, mm: "MemoryManager") -> None:
        """Whether the fold reached the snapshot spec_snapshot asked for."""

    def snapshot_quiet(self, req: Req, max_steps: int) -> bool:
        """Whether the next max_steps tokens past req's computed_len need no snapshot and none is pending: verify
        steps chained onto one in flight (positions only the device knows) and a launch of several decode steps take
        no snapshots."""
        return True

    def release(self, req: Req, mm: "MemoryManager", keep: bool) -> None:
        """Take back req's memory at finish or retraction (keep: the cache may keep its prefix) or abort."""
        mm.free_pages(req.pages)
        if req.slot is not None:
            mm.free_slot(req.slot)

    def evict(self, mm: "MemoryManager", pages: int = 0, slots: int = 0) -> None:
        pass

    def owned(self) -> tuple[set[int], set[int]]:
        return set(), set()

    def check_invariants(self, mm: "MemoryManager") -> None:
        pass


class MemoryManager:
    def __init__(self, mem: Memory, cache=None, poison_freed_slots: bool = False):
        self.mem = mem
        self.kv, self.state = mem.kv, mem.state
        self.page_size = mem.page_size
        self.cache = cache or NoCache()
        # tests poison freed slots with NaN so that a restore of a slot nothing wrote fails loudly
        self.poison = poison_freed_slots
        # memory operations decided while scheduling (restores, unified-pool moves, poison), with physical ids,
        # executed in this order on the forward stream before the next forward
        self.ops: list[tuple] = []

    # ---- accounting
    @property
    def num_free_pages(self) -> int:
        return self.mem.num_free_pages

    @property
    def num_free_slots(self) -> int:
        return self.mem.num_free_slots

    def pages_needed(self, req: Req, new_tokens: int) -> int:
        """Pages to add so that positions < computed_len + new_tokens are covered."""
        return max(0, -(-(req.computed_len + new_tokens) // self.page_size) - len(req.pages))

    # ---- allocation (evicting from the cache when short)
    def alloc_pages(self, n: int) -> list[int]:
        self.can_alloc(n, 0)
        return self.mem.alloc_pages(n)

    def alloc_slot(self) -> int:
        self.can_alloc(0, 1)
        return self.mem.alloc_slot()

    def can_alloc(self, pages: int, slots: int) -> bool:
        """Whether pages and slots can be had, evicting cache entries (KV first) if that is what it takes."""
        short_pages, short_slots = self.mem.shortfall(pages, slots)
        if short_pages:
            self.cache.evict(self, pages=short_pages)
            short_pages, short_slots = self.mem.shortfall(pages, slots)
        if short_slots:
            self.cache.evict(self, slots=short_slots)
            short_pages, short_slots = self.mem.shortfall(pages, slots)
        return short_pages == 0 and short_slots == 0

    def free_pages(self, pages) -> None:
        self.ops += self.mem.free_pages(pages)

    def free_slot(self, slot: int) -> None:
        ops, freed = self.mem.free_slot(slot)
        self.ops += ops
        if self.poison:
            # on the forward stream, after anything queued that may still read the block
            self.ops.append(("poison_slot", freed))

    def restore(self, src: int, dst: int) -> None:
        """Queue a copy of slot src's state into slot dst (copy-on-write restore of a checkpoint)."""
        self.ops.append(("copy_slot", self.mem.slot_phys(src), self.mem.slot_phys(dst)))

    def take_ops(self) -> list[tuple]:
        out, self.ops = self.ops, []
        return out

    def extend(self, req: Req, new_tokens: int) -> None:
        """Give req the pages for its next new_tokens (the caller checked availability)."""
        need = self.pages_needed(req, new_tokens)
        if need:
            req.pages.extend(self.alloc_pages(need))

    def release(self, req: Req, keep: bool) -> None:
        """Take back everything req holds (with keep, the cache may keep its prefix)."""
        self.cache.release(req, self, keep)
        req.pages, req.slot, req.shared_pages = [], None, 0

    def check_invariants(self, reqs: list[Req]) -> None:
        self.mem.check()
        cache_pages, cache_slots = self.cache.owned()
        owned_pages, owned_slots = set(cache_pages), set(cache_slots)
        for r in reqs:
            private = r.pages[r.shared_pages:]
            for p in private:
                assert p not in owned_pages, f"page {p} owned twice ({r.rid})"
                owned_pages.add(p)
            for p in r.pages[: r.shared_pages]:
                assert p in cache_pages, f"request {r.rid} borrows page {p} the cache does not own"
            if r.slot is not None:
                assert r.slot not in owned_slots, f"slot {r.slot} owned twice ({r.rid})"
                owned_slots.add(r.slot)
        assert owned_pages == self.kv.pages.used, (
            f"pages in use but unowned: {sorted(self.kv.pages.used - owned_pages)[:8]}, "
            f"owned but free: {sorted(owned_pages - self.kv.pages.used)[:8]}")
        assert owned_slots == self.state.slots.used, (
            f"slots in use but unowned: {sorted(self.state.slots.used - owned_slots)}, "
            f"owned but free: {sorted(owned_slots - self.state.slots.used)}")
        self.cache.check_invariants(self)


__all__ = ["MemoryManager", "NoCache", "OutOfMemory"]
