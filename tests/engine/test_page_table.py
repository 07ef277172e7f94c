"""The persistent host page table (kestrel.engine.page_table) against the tables built from whole page lists."""

import random
from types import SimpleNamespace

import torch

from kestrel.engine.batch import int_tensor, padded_rows
from kestrel.engine.page_table import HostPageTable


class _Memory:
    """Logical -> physical page ids that change when pages move (as the unified pool's do), with its epoch."""

    def __init__(self):
        self.phys, self.page_epoch = {}, 0

    def page_phys(self, ids):
        return [self.phys.setdefault(i, i + 10_000) for i in ids]


def test_synced_rows_equal_padded_page_lists():
    """Requests' page lists change as the scheduler and the prefix cache change them (pages appended, shared
    pages swapped in at the head in place, lists released and matched again, requests leaving and new ones taking
    their rows, more requests than rows, pages moved by the memory); every step's gathered table equals the
    padded physical lists, whichever requests and order the step takes."""
    rng = random.Random()
    pad = 3
    table = HostPageTable(rows=5, pad=pad, width=4)  # narrow and few: rows widen, and requests get evicted
    mem = _Memory()
    reqs: dict[str, SimpleNamespace] = {}
    for step in range(500):
        op = rng.random()
        if op < 0.15 or not reqs:
            rid = f"r{step}"
            reqs[rid] = SimpleNamespace(rid=rid, pages=[rng.randrange(1000) for _ in range(rng.randrange(6))],
                                        pages_epoch=0)
        elif op < 0.25:
            table.forget(reqs.pop(rng.choice(sorted(reqs))).rid)
        elif op < 0.3:  # the memory moves some pages
            for i in rng.sample(sorted(mem.phys), min(3, len(mem.phys))):
                mem.phys[i] = rng.randrange(20_000, 30_000)
            mem.page_epoch += 1
        else:
            for r in rng.sample(sorted(reqs.values(), key=lambda r: r.rid), rng.randint(1, len(reqs))):
                kind = rng.random()
                if kind < 0.6:
                    r.pages.extend(rng.randrange(1000) for _ in range(rng.randrange(9)))
                elif kind < 0.8 and r.pages:  # shared pages swapped in at the head, in place
                    k = rng.randrange(1, len(r.pages) + 1)
                    r.pages[:k] = [rng.randrange(1000) for _ in range(k)]
                    r.pages_epoch += 1
                else:  # released (retraction) and given pages again: a new list
                    r.pages = r.pages[: rng.randrange(len(r.pages) + 1)]
        if not reqs:
            continue
        batch = rng.sample(sorted(reqs.values(), key=lambda r: r.rid), rng.randint(1, min(len(reqs), 6)))
        width = max(len(r.pages) for r in batch)
        rows = len(batch) + rng.randrange(3)
        want = int_tensor(padded_rows([mem.page_phys(r.pages) for r in batch], width, pad, rows), torch.int32)
        got = table.gather(table.sync(batch, mem, width), width, rows)
        assert got.dtype == torch.int32 and torch.equal(got.reshape(-1), want), [r.rid for r in batch]


def test_a_sync_writes_only_the_pages_appended():
    """A request whose list only grew has just its new pages written: the rest of its row is not rewritten (the
    point of the table). Poisoning the row's old entries shows whether they were written again; a change in place
    (its epoch bumped) or a page move rewrites the row."""
    table, mem = HostPageTable(rows=2, pad=0), _Memory()
    r = SimpleNamespace(rid="a", pages=[5, 6, 7], pages_epoch=0)
    (row,) = table.sync([r], mem, 3)
    table.table[row, :3] = -1  # not what the table last wrote: a rewrite would restore it
    r.pages.append(8)
    assert table.gather(table.sync([r], mem, 4), 4).tolist() == [[-1, -1, -1, 10_008]]
    r.pages_epoch += 1
    assert table.gather(table.sync([r], mem, 4), 4).tolist() == [[10_005, 10_006, 10_007, 10_008]]
    table.table[row, :3] = -1
    mem.page_epoch += 1
    assert table.gather(table.sync([r], mem, 4), 4).tolist() == [[10_005, 10_006, 10_007, 10_008]]
