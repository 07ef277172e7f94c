"""Context lookup: draft a block by copying what followed the latest earlier occurrence of the context's last n-gram.

A request's recent tokens live in a window [B, W] (right-aligned; -1 before its first token). For the longest n in
[min_n, max_n] whose suffix n-gram occurs earlier in the window, the draft is the tokens that followed that
occurrence, extended periodically when fewer than gamma follow it (the latest occurrence of a loop's n-gram is one
period back, so the loop continues). Everything is fixed-shape tensor work (no host reads), so the same code runs on
a CPU, on a GPU and inside a CUDA graph. The DSpark step takes these drafts where its drafter doubts its own first
token (`SpecWorker`), the way SGLang's and vLLM's n-gram drafters serve repetitive text.
"""

import torch

from kestrel.ops import kernel

WINDOW = 256
MIN_N = 2
MAX_N = 4


def empty_window(width: int = WINDOW, device=None) -> torch.Tensor:
    return torch.full((width,), -1, dtype=torch.int64, device=device)


def fill_window(tokens: list[int], width: int = WINDOW, device=None) -> torch.Tensor:
    """A window holding the last `width` of `tokens`."""
    w = empty_window(width)
    tail = tokens[-width:] if tokens else []
    if tail:
        w[width - len(tail):] = torch.tensor(tail, dtype=torch.int64)
    return w.to(device) if device is not None else w


def append(window: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Each row's window after appending its first count[b] of tokens[b] (window [B, W], tokens [B, K], count [B]);
    on a GPU one kernel."""
    fn = kernel("kestrel.ops.lookup_triton", "append", window)
    out = fn(window, tokens, count) if fn is not None else None
    if out is not None:
        return out
    B, W = window.shape
    K = tokens.shape[1]
    both = torch.cat([window, tokens], 1)  # [B, W + K]
    start = count.to(torch.int64).clamp(0, K).view(B, 1) + torch.arange(W, device=window.device).view(1, W)
    return both.gather(1, start)


def lookup(window: torch.Tensor, gamma: int, min_n: int = MIN_N,
           max_n: int = MAX_N) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [B, gamma] int64, found [B] bool): per row, the tokens after the latest earlier occurrence of the
    longest suffix n-gram, n in [min_n, max_n]; rows without one get found False (their drafts are arbitrary)."""
    B, W = window.shape
    dev = window.device
    pos = torch.arange(W, device=dev)
    best = torch.full((B,), -1, dtype=torch.int64, device=dev)  # where the continuation starts
    for n in range(min_n, max_n + 1):
        if W <= n:
            break
        grams = window.unfold(1, n, 1)  # [B, W - n + 1, n]: the n-gram starting at each position
        suffix = window[:, W - n:]
        # an earlier occurrence: starts before the suffix itself, every token real (not the -1 padding)
        hit = (grams[:, :-1] == suffix.unsqueeze(1)).all(-1) & (suffix >= 0).all(-1, keepdim=True)
        last = torch.where(hit, pos[: W - n].view(1, -1), -1).amax(1)  # latest start, -1 when none
        # a longer n-gram's match wins: take this n's only where it found one
        best = torch.where(last >= 0, last + n, best)
    found = best >= 0
    start = best.clamp(min=0)
    period = (W - start).clamp(min=1)  # tokens between the continuation's start and the window's end
    idx = start.view(B, 1) + torch.arange(gamma, device=dev).view(1, gamma) % period.view(B, 1)
    return window.gather(1, idx.clamp(max=W - 1)), found


def step(window: torch.Tensor, x0: torch.Tensor, real: torch.Tensor, gamma: int, min_n: int = MIN_N,
         max_n: int = MAX_N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the windows with each real row's x0 appended, drafts [B, gamma], found [B]): `append`, then `lookup` on the
    new windows; on a GPU one kernel (`kestrel/ops/lookup_triton.py`)."""
    fn = kernel("kestrel.ops.lookup_triton", "step", window)
    out = fn(window, x0, real, gamma, min_n, max_n) if fn is not None else None
    if out is not None:
        return out
    window = append(window, x0.view(-1, 1), real.long())
    return (window, *lookup(window, gamma, min_n, max_n))


def select(window: torch.Tensor, x0: torch.Tensor, real: torch.Tensor, gamma: int, drafts: torch.Tensor,
           confidence: torch.Tensor, below: float, min_n: int = MIN_N,
           max_n: int = MAX_N) -> tuple[torch.Tensor, torch.Tensor]:
    """(the windows after `step`, the drafts [B, gamma]): a block takes the lookup's drafts where the lookup found
    one and the drafter's confidence [B] in its own drafts is below `below`, else keeps `drafts`; on a GPU one
    kernel (the step's, choosing too)."""
    fn = kernel("kestrel.ops.lookup_triton", "select", window)
    out = fn(window, x0, real, gamma, drafts, confidence, below, min_n, max_n) if fn is not None else None
    if out is not None:
        return out
    window, cand, found = step(window, x0, real, gamma, min_n, max_n)
    use = found & (confidence < below)
    return window, torch.where(use.view(-1, 1), cand, drafts)


def lookup_reference(tokens: list[int], gamma: int, min_n: int = MIN_N, max_n: int = MAX_N) -> list[int] | None:
    """`lookup` for one sequence, written as the plain search it is (the tests' oracle)."""
    L = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if L <= n:
            continue
        suffix = tokens[L - n:]
        for s in range(L - n - 1, -1, -1):
            if tokens[s : s + n] == suffix:
                follow = tokens[s + n:]
                return [follow[i % len(follow)] for i in range(gamma)]
    return None
