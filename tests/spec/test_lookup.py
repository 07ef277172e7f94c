"""Context lookup drafts (kestrel.spec.lookup) against the plain search, and the worker's choice between sources."""

import random

import pytest
import torch

from kestrel.config import ServerArgs
from kestrel.spec import lookup as L
from kestrel.spec.drafter import DraftOutput
from kestrel.spec.worker import LOOKUP_BELOW_CONFIDENCE, SpecWorker


def _sequences(seed: int, rows: int, width: int) -> list[list[int]]:
    """Token lists of every length up to the window, over small vocabularies (so n-grams repeat, at every n), some
    built from a repeated motif (loops), one empty and one a single token."""
    rng = random.Random(seed)
    seqs = [[], [3]]
    while len(seqs) < rows:
        n = rng.randint(1, width)
        vocab = rng.choice([2, 3, 5, 40])
        if rng.random() < 0.3:
            motif = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
            seqs.append([rng.randrange(vocab) for _ in range(rng.randint(0, 5))] + (motif * n)[:n])
        else:
            seqs.append([rng.randrange(vocab) for _ in range(n)])
    return seqs


def test_lookup_is_the_plain_search():
    """Longest n-gram first, its latest earlier occurrence, the continuation extended periodically: equal to the
    reference search on random windows (a wrong n order, an earliest instead of latest match, or a continuation
    not wrapped at the window's end each fail here)."""
    width, gamma = 24, 7
    seqs = _sequences(0, 300, width)
    window = torch.stack([L.fill_window(s, width) for s in seqs])
    drafts, found = L.lookup(window, gamma)
    hits = 0
    for s, d, f in zip(seqs, drafts.tolist(), found.tolist()):
        want = L.lookup_reference(s, gamma)
        assert f == (want is not None), s
        if want is not None:
            hits += 1
            assert d == want, s
    assert 50 < hits < len(seqs)  # both cases are exercised


def test_window_append_keeps_the_latest_tokens():
    width = 10
    seqs = _sequences(1, 40, 16)
    rng = random.Random(2)
    adds = [[rng.randrange(50) for _ in range(4)] for _ in seqs]
    counts = [rng.randint(0, 4) for _ in seqs]
    window = torch.stack([L.fill_window(s, width) for s in seqs])
    got = L.append(window, torch.tensor(adds), torch.tensor(counts))
    for s, a, c, row in zip(seqs, adds, counts, got.tolist()):
        assert row == L.fill_window(s + a[:c], width).tolist()


def test_worker_takes_lookups_only_where_the_drafter_doubts():
    """`_lookup_drafts`: x0 is appended to each real row; a row takes the lookup exactly where one exists and its
    first draft's confidence is below the threshold; a drafter without confidences keeps its drafts."""
    gamma = 4
    worker = SpecWorker.__new__(SpecWorker)
    worker.gamma = gamma
    seqs = [[1, 2, 3, 1, 2], [1, 2, 3, 1, 2], [5, 6, 7, 8], [1, 2, 3, 1, 2]]
    x0 = torch.tensor([3, 3, 9, 3])
    real = torch.tensor([True, True, True, False])
    window = torch.stack([L.fill_window(s, 12) for s in seqs])
    drafted = torch.full((4, gamma), 7)
    low, high = LOOKUP_BELOW_CONFIDENCE - 0.1, LOOKUP_BELOW_CONFIDENCE + 0.1
    conf = torch.tensor([[low] * gamma, [high] * gamma, [low] * gamma, [low] * gamma])
    win, tokens = worker._lookup_drafts(window, x0, DraftOutput(drafted.clone(), None, conf), real)
    assert win[0].tolist()[-6:] == [1, 2, 3, 1, 2, 3] and win[3].tolist() == window[3].tolist()
    assert tokens[0].tolist() == [1, 2, 3, 1]  # "1 2 3" occurred first: what followed it, wrapped
    assert tokens[1].tolist() == [7] * gamma  # confident drafter
    assert tokens[2].tolist() == [7] * gamma  # no earlier occurrence of "8 9" (nor "9")
    # the padding row appended nothing: its suffix "1 2" occurs earlier, so it looks up from the old window
    assert tokens[3].tolist() == [3, 1, 2, 3]
    _, kept = worker._lookup_drafts(window, x0, DraftOutput(drafted.clone(), None, None), real)
    assert torch.equal(kept, drafted)


def test_context_lookup_flag():
    """auto is on (on a CPU and on a GPU alike); off turns it off; a bad value names the flag."""
    assert ServerArgs(device="cpu").context_lookup and ServerArgs(device="cuda").context_lookup
    assert not ServerArgs(device="cuda", speculative_context_lookup="off").context_lookup
    assert not ServerArgs(device="cpu", speculative_context_lookup="off").context_lookup
    with pytest.raises(ValueError, match="speculative-context-lookup"):
        ServerArgs(speculative_context_lookup="maybe")
