"""The page tables a step sends to the device, kept as a persistent host table written as requests' pages change.

A running request's page list grows by a few pages a step and otherwise stays as it was, but each step needs the
whole table as integers on the device. Building it from every request's whole list (the physical ids, then a
tensor from Python ints) made the engine's step at batch 64 with 1024-token prompts take 4.1-4.3 ms of host time on
the H200's host, 2.4 ms with this table, against a 0.93 ms k3-small decode graph (benchmarks/host_timers.py
--batch 64 --prompt-len 1024; docs/benchmarks.md). Here each request keeps a row of a host int32 array. The
scheduler syncs a request's row when it builds a step, writing only the pages appended since the last sync, and the
step's table is one gather of its rows (vLLM keeps its block tables on the host the same way; SGLang's
req_to_token keeps them on the device, which needs every kernel reading a table to index it by request).

A row is rewritten whole when its request's page list is a new list (released, matched again by the prefix cache),
when the list changed in place other than by appending (`Req.pages_epoch`: the prefix cache swapping shared pages
in at its head), or when the memory moved pages (`page_epoch`: the unified pool). Invariant: a row holds its
request's physical pages as of its last sync, padded with the scratch page to the table's width, so a gathered row
equals the padded list `padded_rows` builds (the scheduler checks this after every step under `check_invariants`;
`tests/engine/test_page_table.py`).
"""

import torch

# runs of changed pages up to this long are written together in one indexed write, longer ones as row slices; a
# step with at most FEW_RUNS short runs writes them as slices too (building the index arrays costs more)
SHORT_RUN = 16
FEW_RUNS = 4


class HostPageTable:
    def __init__(self, rows: int, pad: int, width: int = 256):
        """rows: requests held at once (more evict the least recently synced, unless one step has more); pad: the
        scratch page, the value past a request's pages (and of row 0, the padding rows' row); width: the pages a
        row holds at first (it doubles when a longer list comes)."""
        self.pad = pad
        self.table = torch.full((rows + 1, width), pad, dtype=torch.int32)
        self._rows = self.table.numpy()  # (shares the tensor's memory: the writes)
        # per row: (the page list object synced, its epoch, the memory's page epoch, pages written) of its request
        self.synced: list[tuple] = [(None, 0, 0, 0) for _ in range(rows + 1)]
        self.row_of: dict[str, int] = {}  # rid -> its row (insertion order: least recently synced first)
        self.free = list(range(rows, 0, -1))

    def sync(self, reqs, mem, width: int) -> list[int]:
        """Bring the rows of `reqs` (their `rid`, `pages`, `pages_epoch`) up to date with their pages' physical ids
        (`mem.page_phys`, `mem.page_epoch`); width: their longest page list. Returns their rows."""
        rows_now, width_now = self.table.shape
        if width > width_now or len(reqs) >= rows_now:  # (one step's requests never evict each other)
            self._resize(max(rows_now, 2 * len(reqs) + 1), max(width_now, width))
        runs: list[tuple[int, int, list[int]]] = []  # (row, first column, values) of each changed run
        moved = mem.page_epoch
        idx = []
        for r in reqs:
            row = self.row_of.pop(r.rid, None)
            if row is None:
                row = self.free.pop() if self.free else self._evict()
            self.row_of[r.rid] = row  # (most recently synced last)
            pages, (obj, epoch, at_move, k) = r.pages, self.synced[row]
            n = len(pages)
            if obj is pages and epoch == r.pages_epoch and at_move == moved and n >= k:
                if n > k:  # only appended since
                    runs.append((row, k, mem.page_phys(pages[k:])))
            else:
                runs.append((row, 0, mem.page_phys(pages)))
                if k > n:
                    runs.append((row, n, [self.pad] * (k - n)))
            self.synced[row] = (pages, r.pages_epoch, moved, n)
            idx.append(row)
        short = [run for run in runs if len(run[2]) <= SHORT_RUN]
        few = len(short) <= FEW_RUNS
        for row, col, vals in runs if few else [run for run in runs if len(run[2]) > SHORT_RUN]:
            self._rows[row, col : col + len(vals)] = vals
        if not few:  # (one indexed write for the pages a step appends: a numpy call costs more than its values)
            self._rows[[row for row, _, vals in short for _ in vals],
                       [col + j for _, col, vals in short for j in range(len(vals))]] = [
                v for _, _, vals in short for v in vals]
        return idx

    def gather(self, rows: list[int], width: int, n_rows: int | None = None) -> torch.Tensor:
        """The [n_rows, width] int32 table (a new CPU tensor) of the given rows (`sync`'s), then padding rows of the
        scratch page up to n_rows (default: none)."""
        idx = rows + [0] * ((n_rows or len(rows)) - len(rows))
        # (numpy's row gather copies each row's span at once: half the time of torch's index_select over the
        # column slice on this CPU, and the same on every torch version)
        return torch.from_numpy(self._rows[idx, :width])

    def _resize(self, rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        if width > old_width:
            width = max(width, 2 * old_width)
        table = torch.full((rows, width), self.pad, dtype=torch.int32)
        table[:old_rows, :old_width] = self.table
        self.table, self._rows = table, table.numpy()
        self.synced += [(None, 0, 0, 0) for _ in range(rows - old_rows)]
        self.free = list(range(rows - 1, old_rows - 1, -1)) + self.free

    def _evict(self) -> int:
        """The least recently synced request's row (its request gets a row again when it next runs)."""
        rid = next(iter(self.row_of))
        return self.row_of.pop(rid)

    def forget(self, rid: str) -> None:
        """A request left the engine: its row back to the free rows (its pages stay written: the next owner's
        sync rewrites the row, its list being another object)."""
        row = self.row_of.pop(rid, None)
        if row is not None:
            self.free.append(row)
