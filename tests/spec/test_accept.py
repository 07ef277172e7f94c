import torch

from kestrel.ops.dspark.reference import accept_greedy, accept_lazy


def test_lazy_head_accepts_as_the_full_head():
    """The CPU greedy step's LM head applied only to the rows acceptance reads (accept_lazy) accepts, commits and
    gathers exactly as the head over every row, and computes each real block's rows up to its first mismatch only."""
    gen = torch.Generator().manual_seed(0)
    B, L, D, V = 7, 8, 16, 50
    w = torch.randn(V, D, generator=gen, dtype=torch.float64)
    hidden = torch.randn(B * L, D, generator=gen, dtype=torch.float64)
    logits = hidden @ w.t()
    top = logits.argmax(-1).view(B, L)
    matched = [0, 1, 3, 7, 7, 2, 5]  # leading drafts equal to the target's argmax
    keep = torch.tensor([7, 7, 7, 7, 4, 7, 6])
    n = keep + 1
    n[5] = 0  # a padding row: commits nothing, and its rows are never computed
    drafts = torch.randint(0, V, (B, L - 1), generator=gen)
    for i, m in enumerate(matched):
        drafts[i, :m] = top[i, :m]
        if m < L - 1:
            drafts[i, m] = (top[i, m] + 1) % V
    snap_n = torch.tensor([0, 2, 3, 0, 9, 1, 6])
    rows = []

    def head(h):
        rows.append(h.shape[0])
        return h @ w.t()

    got, want = accept_lazy(hidden, head, drafts, keep, n, snap_n, L), accept_greedy(logits, drafts, keep, n, snap_n)
    real = n > 0  # a padding row's packed tokens are never read
    assert torch.equal(got[0][real], want[0][real])
    assert torch.equal(got[0][~real], torch.cat([drafts[~real], torch.zeros(1, 2, dtype=torch.long)], 1))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[1:], want[1:]))
    acc = [min(m, int(k)) for m, k in zip(matched, keep)]
    assert sum(rows) == sum(a + 1 for i, a in enumerate(acc) if n[i] > 0)
    assert len(rows) == max(acc) + 1  # one head call a position, over the blocks still matching
