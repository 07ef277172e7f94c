"""Host-side layout of a packed varlen batch for the chunked KDA kernels: which chunks, aligned to absolute
positions, each sequence's rows fall into. Plain numpy, so it runs (and is tested) without Triton."""

import numpy as np


def chunk_table(cu: list[int], starts: list[int], C: int):
    """One int32 array: per chunk (sequence, first row's packed index, valid rows [lo, hi)), then per sequence the
    first chunk (N + 1 offsets), then the sequences from most chunks to fewest (the recurrence starts the longest
    first, so the last wave of its programs is short ones). Vectorised: this runs on the host before the first
    launch of every call with a new batch layout."""
    cu_a = np.asarray(cu, dtype=np.int64)
    front = np.asarray(starts, dtype=np.int64) % C
    n = -(-(front + np.diff(cu_a)) // C)
    offsets = np.concatenate(([0], np.cumsum(n)))
    seq = np.repeat(np.arange(len(n)), n)
    j = np.arange(offsets[-1]) - offsets[:-1][seq]
    info = np.stack((seq, cu_a[:-1][seq] - front[seq] + j * C, cu_a[:-1][seq], cu_a[1:][seq]), 1)
    order = np.argsort(-n, kind="stable")
    return np.concatenate((info.reshape(-1), offsets, order)).astype(np.int32), offsets.tolist()
