"""The page tables a step sends to the device, built from a persistent host copy written incrementally.

A running request's page list grows by a few pages a step and otherwise stays as it was, but each step needs the
whole table as integers on the device: converting every request's full list from Python ints (what `int_tensor`
of the padded rows does) cost ~0.35-0.55 ms of host time a step at batch 64 on the H200's host, more than half a
k3-small decode graph (benchmarks/host_timers.py --batch 64). Here each request keeps a row of a host int32 array;
a step writes only what changed since that row was last written (usually the pages appended), and the step's table
is one gather of its rows (vLLM keeps its block tables the same way). SGLang's req_to_token pool goes further and
keeps the table on the device; that needs every kernel reading a table to index it by request, and is left for
later.

Invariant: row i holds the physical page list last written to it, padded with the scratch page to the full width,
so a gathered row equals the padded list `padded_rows` would build (`tests/engine/test_page_table.py`).
"""

import threading

import torch

# runs of changed pages up to this long are written together in one indexed write, longer ones as row slices
SHORT_RUN = 16


class HostPageTable:
    def __init__(self, rows: int, pad: int, width: int = 256):
        """rows: requests held at once (more evict the least recently used, unless one step has more); pad: the scratch page, the value past
        a request's pages (and of row 0, the padding rows' row); width: the pages a row holds at first (it doubles
        when a longer list comes)."""
        self.pad = pad
        self.table = torch.full((rows + 1, width), pad, dtype=torch.int32)
        self._rows = self.table.numpy()  # (shares the tensor's memory: the writes)
        self.written: list[list[int]] = [[] for _ in range(rows + 1)]
        self.row_of: dict[str, int] = {}  # rid -> its row (insertion order: least recently used first)
        self.free = list(range(rows, 0, -1))
        self.lock = threading.Lock()  # (the scheduler's thread forgets requests while a CPU's forward thread builds)

    def gather(self, rids, pages: list[list[int]], width: int, rows: int | None = None) -> torch.Tensor:
        """The [rows, width] int32 table (a new CPU tensor) of requests `rids` (rows past them: the scratch page),
        whose physical page lists are `pages` (each at most `width` long; kept until the request's next step, so
        the caller must not change them)."""
        with self.lock:
            rows_now, width_now = self.table.shape
            if width > width_now or len(rids) >= rows_now:  # (a step's requests never evict each other)
                self._resize(max(rows_now, 2 * len(rids) + 1), max(width_now, width))
            # the writes of every row at once: (row, first column, values) of each changed run
            runs: list[tuple[int, int, list[int]]] = []
            idx = [self._write(rid, p, runs) for rid, p in zip(rids, pages, strict=True)]
            short = [run for run in runs if len(run[2]) <= SHORT_RUN]
            for row, col, vals in runs:
                if len(vals) > SHORT_RUN:
                    self._rows[row, col : col + len(vals)] = vals
            if short:  # (one indexed write for the pages a step appends: a numpy call costs more than its values)
                self._rows[[row for row, _, vals in short for _ in vals],
                           [col + j for _, col, vals in short for j in range(len(vals))]] = [
                    v for _, _, vals in short for v in vals]
        idx += [0] * ((rows or len(idx)) - len(idx))
        return self.table[:, :width].index_select(0, torch.tensor(idx))

    def _write(self, rid: str, pages: list[int], runs: list) -> int:
        """rid's row, with the runs that bring it from what was last written to `pages` added to `runs`."""
        row = self.row_of.pop(rid, None)
        if row is None:
            row = self.free.pop() if self.free else self._evict()
        self.row_of[rid] = row  # (most recently used last)
        old = self.written[row]
        n, k = len(pages), len(old)
        if n >= k and pages[:k] == old:
            if n > k:
                runs.append((row, k, pages[k:]))
        else:
            runs.append((row, 0, pages))
            if k > n:
                runs.append((row, n, [self.pad] * (k - n)))
        self.written[row] = pages  # (kept, not copied: callers hand in lists they no longer change)
        return row

    def _resize(self, rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        if width > old_width:
            width = max(width, 2 * old_width)
        table = torch.full((rows, width), self.pad, dtype=torch.int32)
        table[:old_rows, :old_width] = self.table
        self.table, self._rows = table, table.numpy()
        self.written += [[] for _ in range(rows - old_rows)]
        self.free = list(range(rows - 1, old_rows - 1, -1)) + self.free

    def _evict(self) -> int:
        """The least recently used request's row (its request then gets a row again when it next runs)."""
        rid = next(iter(self.row_of))
        return self.row_of.pop(rid)

    def forget(self, rid: str) -> None:
        """A finished request's row back to the free rows (its pages stay written: the next owner's write fixes
        what differs)."""
        with self.lock:
            row = self.row_of.pop(rid, None)
            if row is not None:
                self.free.append(row)
