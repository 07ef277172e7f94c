"""A radix tree over token ids whose nodes own MLA KV pages and, sparsely, KDA state checkpoints.

KV is append-only and shareable at any page; KDA state is one block rewritten by every token, so a cached prefix
is reusable only up to the deepest node on its path that holds a state checkpoint. Checkpoints sit on the chunk
grid (lcm of the 64-token kernel chunk and the page size), at most `max_states_per_path` on a path, LRU-evicted
apart from their KV (leaving a tombstone; a tombstone leaf is removed).

The three state movements (DESIGN §3), all ordered on the serial forward stream:
- restore: the matched checkpoint is copied into the request's working slot before its first forward;
- snapshot: once per prefill chunk (at the chunk's last grid point short of the prompt's end, or at the fork
  where the request leaves the tree) and every `state_track_interval` decode tokens, the forward writes its
  state into a freshly allocated slot;
- donate: after each prefill chunk the tree takes that slot (ownership only, no bytes); decode snapshots are
  kept by the request (the newest replaces the older) and donated at finish or retraction.
A snapshot target is always a fresh slot, so it is never a slot the tree already owns.
"""

import math
from dataclasses import dataclass, field

from kestrel.config import ServerArgs
from kestrel.engine.request import Req
from kestrel.models.config import K3Config

KERNEL_CHUNK = 64


@dataclass(eq=False)
class Node:
    tokens: list[int]  # edge label, a whole number of pages
    pages: list[int]
    parent: "Node | None"
    depth: int  # tokens from the root to the end of this node
    children: dict[tuple, "Node"] = field(default_factory=dict)
    lock_ref: int = 0  # running requests whose page tables include this node's pages
    state: int | None = None  # checkpoint slot: the state after `depth` tokens
    state_lock: int = 0  # restores scheduled but not yet queued
    last_used: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class _ReqCache:
    node: Node  # deepest locked node: req.pages[:node.depth / page_size] are its path's pages
    restore: Node | None = None  # checkpoint to copy into the working slot before the first forward
    fork: int | None = None  # grid position where the request leaves the tree: worth a checkpoint
    snapshot: tuple[int, int] | None = None  # (position, slot) of the newest decode snapshot, not yet donated
    scheduled: tuple[int, int, bool] | None = None  # (position, slot, is_prefill) written by the forward just built


@dataclass
class CacheStats:
    matched_tokens: int = 0  # tokens found in the tree at admission
    reused_tokens: int = 0  # of those, served from cache (up to a checkpoint)
    replayed_tokens: int = 0  # matched but recomputed (no checkpoint deep enough)
    checkpoints_donated: int = 0
    checkpoints_evicted: int = 0
    pages_evicted: int = 0


class RadixCache:
    slots_per_request = 4  # working slot, snapshot buffer, two of headroom (DESIGN §3)

    def __init__(self, args: ServerArgs, cfg: K3Config, checkpoint_every_chunk: bool = False):
        self.ps = args.page_size
        self.grid = math.lcm(KERNEL_CHUNK, self.ps)
        self.interval = -(-args.state_track_interval // self.grid) * self.grid
        self.cap = args.max_states_per_path
        # the naive baseline policy for benchmarks: keep every chunk's snapshot, no per-path cap
        self.every_chunk = checkpoint_every_chunk
        # tokens a match leaves to compute: one (the forward that samples the next token); two under speculation,
        # whose first verify step needs the drafter's features at the token before its input, which only a forward
        # over that token gives (the tree keeps KV and states, not features). A match ending at the last known
        # token's position would send the request to a verify step with neither its features nor its checkpoint
        # restored (the restore runs with a forward's `movements`).
        self.tail = 2 if args.speculative else 1
        self.root = Node([], [], None, 0)
        self.clock = 0
        self.reqs: dict[str, _ReqCache] = {}
        self.stats = CacheStats()

    # ---- tree walks
    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _walk(self, tokens: list[int]):
        """Follow tokens down the tree: (nodes fully matched, matched length, node matched part-way or None)."""
        node, m, path = self.root, 0, []
        while len(tokens) - m >= self.ps:
            child = node.children.get(tuple(tokens[m : m + self.ps]))
            if child is None:
                return path, m, None
            k = 0
            while k < len(child.tokens) and m + k < len(tokens) and child.tokens[k] == tokens[m + k]:
                k += 1
            k -= k % self.ps
            if k < len(child.tokens):
                return path, m + k, child
            m += k
            node = child
            path.append(child)
        return path, m, None

    def _path(self, node: Node) -> list[Node]:
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out[::-1]

    def _lock(self, node: Node, delta: int) -> None:
        while node is not self.root:
            node.lock_ref += delta
            assert node.lock_ref >= 0, "negative lock count"
            node = node.parent

    def _split(self, node: Node, k: int) -> Node:
        """Cut node's edge after k tokens; returns the new upper part (node keeps the lower part)."""
        assert 0 < k < len(node.tokens) and k % self.ps == 0
        upper = Node(node.tokens[:k], node.pages[: k // self.ps], node.parent, node.depth - len(node.tokens) + k,
                     lock_ref=node.lock_ref, last_used=node.last_used)
        upper.children[tuple(node.tokens[k : k + self.ps])] = node
        node.parent.children[tuple(node.tokens[: self.ps])] = upper
        node.tokens, node.pages, node.parent = node.tokens[k:], node.pages[k // self.ps :], upper
        return upper

    def _insert(self, tokens: list[int], pages: list[int], mm) -> Node:
        """Put tokens (a whole number of pages) and their pages in the tree; returns the node ending there.

        Where the tree already holds a position, its page is kept and the caller's duplicate is freed; the
        caller's page list is rewritten in place to the tree's pages.
        """
        node, m = self.root, 0
        now = self._tick()
        while m < len(tokens):
            key = tuple(tokens[m : m + self.ps])
            child = node.children.get(key)
            if child is None:
                child = Node(tokens[m:], pages[m // self.ps : len(tokens) // self.ps], node, len(tokens), last_used=now)
                node.children[key] = child
                return child
            k = 0
            while k < len(child.tokens) and m + k < len(tokens) and child.tokens[k] == tokens[m + k]:
                k += 1
            k -= k % self.ps
            if k < len(child.tokens):
                child = self._split(child, k)
            dup = [p for p, q in zip(pages[m // self.ps : (m + k) // self.ps], child.pages) if p != q]
            mm.free_pages(dup)
            pages[m // self.ps : (m + k) // self.ps] = child.pages
            child.last_used = now
            node, m = child, m + k
        return node

    # ---- the interface the scheduler drives (see mem.manager.NoCache)
    def match(self, req: Req, mm) -> int:
        tokens = req.tokens(0, req.known_len)
        path, m, partial = self._walk(tokens)
        # reusable up to the deepest checkpoint that leaves at least `tail` tokens to compute
        ckpt = next((n for n in reversed(path) if n.state is not None and n.depth <= len(tokens) - self.tail), None)
        depth = ckpt.depth if ckpt else 0
        self.stats.matched_tokens += m
        self.stats.reused_tokens += depth
        self.stats.replayed_tokens += min(m, len(tokens) - 1) - depth if m > depth else 0
        info = _ReqCache(node=ckpt or self.root)
        if ckpt is not None:
            now = self._tick()
            for n in self._path(ckpt):
                n.last_used = now
            self._lock(ckpt, +1)
            ckpt.state_lock += 1
            info.restore = ckpt
            req.pages = [p for n in self._path(ckpt) for p in n.pages]
            req.shared_pages = len(req.pages)
            req.computed_len = depth
        # where the request leaves the tree, on the grid: a branch point the next request can resume from
        fork = (min(m, len(tokens) - 1) // self.grid) * self.grid
        if fork > depth and not self.every_chunk:
            info.fork = fork
        self.reqs[req.rid] = info
        return depth

    def unmatch(self, req: Req, mm) -> None:
        info = self.reqs.pop(req.rid)
        if info.restore is not None:
            info.restore.state_lock -= 1
        self._lock(info.node, -1)
        req.pages, req.shared_pages, req.computed_len = [], 0, 0

    def chunk_limit(self, req: Req) -> int | None:
        """Tokens the next prefill chunk may take so that it ends at the fork (its snapshot lands there)."""
        info = self.reqs.get(req.rid)
        if info is None or info.fork is None or info.fork <= req.computed_len:
            return None
        return info.fork - req.computed_len

    def movements(self, req: Req, n: int, mm):
        info = self.reqs[req.rid]
        restore = None
        if info.restore is not None:
            restore = (info.restore.state, req.slot)
        start, end = req.computed_len, req.computed_len + n
        pos = self._snapshot_position(req, info, start, end)
        track = None
        if pos is not None:
            slot = self._alloc_slot(mm)
            if slot is not None:
                info.scheduled = (pos, slot, self._is_prefill(req, start))
                track = (pos - start, slot)
        return restore, track

    @staticmethod
    def _is_prefill(req: Req, start: int) -> bool:
        """A forward that feeds known tokens before the last one (a prompt chunk, or a resumed sequence)."""
        return start < req.known_len - 1

    def _snapshot_position(self, req: Req, info: _ReqCache, start: int, end: int) -> int | None:
        if self._is_prefill(req, start):
            # at the fork if this chunk reaches it, else at the last grid point short of the known tokens' end
            if info.fork is not None and start < info.fork <= end:
                return info.fork
            last = min(end, req.known_len - 1) // self.grid * self.grid
            return last if last > start and last > info.node.depth else None
        # decode: every `interval` tokens
        return end if end % self.interval == 0 else None

    def _alloc_slot(self, mm) -> int | None:
        """A slot for a snapshot if one can be had (snapshots are an optimisation: never fail for them)."""
        if mm.num_free_slots < 1:
            self.evict(mm, slots=1)
        return mm.mem.alloc_slot() if mm.num_free_slots >= 1 else None

    def spec_snapshot(self, req: Req, max_steps: int, mm) -> tuple[int, int] | None:
        """Decode snapshots under speculation: the next interval boundary, if a verify step may commit past it."""
        info = self.reqs[req.rid]
        start = req.computed_len
        pos = (start // self.interval + 1) * self.interval
        if pos > start + max_steps:
            return None
        slot = self._alloc_slot(mm)
        if slot is None:
            return None
        info.scheduled = (pos, slot, False)
        return pos - start, slot

    def snapshot_quiet(self, req: Req, max_steps: int) -> bool:
        info = self.reqs[req.rid]
        pos = (req.computed_len // self.interval + 1) * self.interval
        return info.scheduled is None and pos > req.computed_len + max_steps

    def spec_after(self, req: Req, taken: bool, mm) -> None:
        info = self.reqs[req.rid]
        if info.scheduled is None:
            return
        pos, slot, _ = info.scheduled
        info.scheduled = None
        if not taken:
            mm.free_slot(slot)
            return
        if info.snapshot is not None:
            mm.free_slot(info.snapshot[1])
        info.snapshot = (pos, slot)

    def after_forward(self, req: Req, mm) -> None:
        info = self.reqs[req.rid]
        if info.restore is not None:
            info.restore.state_lock -= 1
            info.restore = None
        if info.scheduled is None:
            return
        pos, slot, prefill = info.scheduled
        info.scheduled = None
        if prefill:
            self._donate(req, info, pos, slot, mm)
            if info.fork is not None and pos >= info.fork:
                info.fork = None
        else:
            if info.snapshot is not None:
                mm.free_slot(info.snapshot[1])
            info.snapshot = (pos, slot)

    def _donate(self, req: Req, info: _ReqCache, pos: int, slot: int, mm) -> None:
        """The tree takes `slot` as the checkpoint after `pos` tokens, inserting req's KV up to there."""
        n_pages = pos // self.ps
        head = req.pages[:n_pages]
        node = self._insert(req.tokens(0, pos), head, mm)
        req.pages[:n_pages] = head
        req.pages_epoch += 1
        self._lock(node, +1)
        self._lock(info.node, -1)
        info.node = node
        req.shared_pages = n_pages
        if node.state is not None:
            mm.free_slot(slot)
            return
        node.state = slot
        node.last_used = self._tick()
        self.stats.checkpoints_donated += 1
        if not self.every_chunk:
            self._enforce_cap(node, mm)

    def _enforce_cap(self, node: Node, mm) -> None:
        path = [n for n in self._path(node) if n.state is not None]
        while len(path) > self.cap:
            # drop a checkpoint that is not a branch point first, the least recently used first
            candidates = [n for n in path if n is not node and n.state_lock == 0]
            if not candidates:
                return
            victim = min(candidates, key=lambda n: (len(n.children) > 1, n.last_used))
            self._drop_state(victim, mm)
            path.remove(victim)

    def release(self, req: Req, mm, keep: bool) -> None:
        """At finish (keep) or retraction (keep): the tree takes req's KV up to its last full page and its newest
        decode snapshot; at abort (not keep) everything private is simply freed."""
        info = self.reqs.pop(req.rid)
        if info.restore is not None:
            info.restore.state_lock -= 1
        upto = min(req.computed_len, req.known_len) // self.ps * self.ps if keep else 0
        if upto > info.node.depth:
            head = req.pages[: upto // self.ps]
            node = self._insert(req.tokens(0, upto), head, mm)
            req.pages[: upto // self.ps] = head
            self._lock(node, +1)
            self._lock(info.node, -1)
            info.node = node
            req.shared_pages = upto // self.ps
        if info.snapshot is not None:
            pos, slot = info.snapshot
            target = self._node_at(req.tokens(0, pos)) if keep and pos <= upto else None
            if target is not None and target.state is None:
                target.state = slot
                target.last_used = self._tick()
                self.stats.checkpoints_donated += 1
                if not self.every_chunk:
                    self._enforce_cap(target, mm)
            else:
                mm.free_slot(slot)
        mm.free_pages(req.pages[req.shared_pages:])
        if req.slot is not None:
            mm.free_slot(req.slot)
        self._lock(info.node, -1)
        self._remove_dead_leaves(info.node, mm)

    def _node_at(self, tokens: list[int]) -> Node | None:
        """The node ending exactly after tokens (a whole number of pages), splitting an edge if need be."""
        path, m, partial = self._walk(tokens)
        if m != len(tokens) or not tokens:
            return None
        if partial is not None:
            return self._split(partial, m - (partial.depth - len(partial.tokens)))
        return path[-1]

    # ---- eviction
    def _drop_state(self, node: Node, mm) -> None:
        mm.free_slot(node.state)
        node.state = None
        self.stats.checkpoints_evicted += 1

    def _remove_leaf(self, node: Node, mm) -> None:
        assert node.is_leaf and node.lock_ref == 0
        if node.state is not None:
            self._drop_state(node, mm)
        mm.free_pages(node.pages)
        self.stats.pages_evicted += len(node.pages)
        del node.parent.children[tuple(node.tokens[: self.ps])]

    def _remove_dead_leaves(self, node: Node, mm) -> None:
        """A leaf without a checkpoint is useless (its KV is reusable only below a checkpoint): remove it."""
        while node is not self.root and node.is_leaf and node.state is None and node.lock_ref == 0:
            parent = node.parent
            self._remove_leaf(node, mm)
            node = parent

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evict(self, mm, pages: int = 0, slots: int = 0) -> None:
        freed_slots = 0
        if slots:
            ckpts = sorted((n for n in self._nodes() if n.state is not None and n.state_lock == 0),
                           key=lambda n: (len(n.children) > 1, n.last_used))
            for n in ckpts[:slots]:
                self._drop_state(n, mm)
                freed_slots += 1
                self._remove_dead_leaves(n, mm)
        if pages:
            freed = 0
            while freed < pages:
                leaves = [n for n in self._nodes() if n.is_leaf and n.lock_ref == 0]
                if not leaves:
                    return
                victim = min(leaves, key=lambda n: n.last_used)
                parent = victim.parent
                freed += len(victim.pages)
                self._remove_leaf(victim, mm)
                self._remove_dead_leaves(parent, mm)

    def flush(self, mm) -> None:
        """Drop everything unlocked (tests: pools must be empty when nothing runs)."""
        self.evict(mm, pages=mm.kv.pages.capacity)

    # ---- ownership proof
    def owned(self) -> tuple[set[int], set[int]]:
        pages, slots = set(), set()
        for n in self._nodes():
            pages.update(n.pages)
            if n.state is not None:
                slots.add(n.state)
        for info in self.reqs.values():
            if info.snapshot is not None:
                slots.add(info.snapshot[1])
            if info.scheduled is not None:
                slots.add(info.scheduled[1])
        return pages, slots

    def check_invariants(self, mm) -> None:
        seen_pages, seen_slots = set(), set()
        for n in self._nodes():
            assert len(n.tokens) % self.ps == 0 and len(n.tokens) > 0, "edge not a whole number of pages"
            assert len(n.pages) * self.ps == len(n.tokens), "pages do not cover the edge"
            assert n.depth == n.parent.depth + len(n.tokens), "depth mismatch"
            assert n.lock_ref >= 0 and n.state_lock >= 0, "negative lock count"
            assert n.parent is self.root or n.parent.lock_ref >= n.lock_ref, "a locked node under an unlocked parent"
            assert not (set(n.pages) & seen_pages), "a page in two nodes"
            seen_pages.update(n.pages)
            if n.state is not None:
                assert n.depth % self.grid == 0, f"checkpoint off the grid at depth {n.depth}"
                assert n.state not in seen_slots, "a slot in two checkpoints"
                seen_slots.add(n.state)
            else:
                assert not n.is_leaf or n.lock_ref > 0, "an unlocked tombstone leaf"
        for rid, info in self.reqs.items():
            if info.node is not self.root:
                assert info.node.lock_ref > 0, f"request {rid} holds an unlocked node"
