"""The persistent host page table (kestrel.engine.page_table) against the tables built from whole page lists."""

import random

import torch

from kestrel.engine.batch import int_tensor, padded_rows
from kestrel.engine.page_table import HostPageTable


def test_gathered_rows_equal_padded_page_lists():
    """Requests' page lists evolve as the scheduler changes them (pages appended, a prefix replaced by shared
    pages, lists truncated and grown back, requests leaving and new ones taking their rows, more requests than
    rows); every step's gathered table equals the padded lists, whichever requests and order the step takes."""
    rng = random.Random()
    pad = 3
    table = HostPageTable(rows=5, pad=pad, width=4)  # narrow: rows must widen as lists grow
    pages: dict[str, list[int]] = {}
    next_rid = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.15 or not pages:  # a new request
            pages[f"r{next_rid}"] = [rng.randrange(1000) for _ in range(rng.randrange(0, 6))]
            next_rid += 1
        elif op < 0.25:  # one leaves (its row is reused)
            rid = rng.choice(sorted(pages))
            del pages[rid]
            table.forget(rid)
        else:
            for rid in rng.sample(sorted(pages), rng.randint(1, len(pages))):
                p, kind = pages[rid], rng.random()
                if kind < 0.6:
                    p += [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]
                elif kind < 0.75 and p:  # shared pages replace a prefix in place
                    k = rng.randrange(1, len(p) + 1)
                    p[:k] = [rng.randrange(1000) for _ in range(k)]
                elif kind < 0.9:  # retracted: released and grown again
                    del p[rng.randrange(0, len(p) + 1):]
                else:  # one page in the middle differs (a physical page moved)
                    if p:
                        p[rng.randrange(len(p))] = rng.randrange(1000)
        if not pages:
            continue
        rids = rng.sample(sorted(pages), rng.randint(1, min(len(pages), 6)))
        lists = [list(pages[r]) for r in rids]
        width = max(1, max(map(len, lists)))
        rows = len(rids) + rng.randrange(0, 3)
        want = int_tensor(padded_rows(lists, width, pad, rows), torch.int32).view(rows, width)
        got = table.gather(rids, lists, width, rows)
        assert got.dtype == torch.int32 and torch.equal(got, want), (rids, lists)


def test_a_step_writes_only_what_changed():
    """A request whose pages only grew has just the new pages written: the rest of its row is not rewritten (the
    point of the table). Poisoning the row's old entries shows whether they were written again."""
    table = HostPageTable(rows=2, pad=0)
    table.gather(["a"], [[5, 6, 7]], 3)
    row = table.row_of["a"]
    table.table[row, :3] = -1  # not what the table last wrote: a rewrite would restore it
    got = table.gather(["a"], [[5, 6, 7, 8]], 4)
    assert got.tolist() == [[-1, -1, -1, 8]]
    got = table.gather(["a"], [[9, 6, 7, 8]], 4)  # the head changed: the whole row is written
    assert got.tolist() == [[9, 6, 7, 8]]
