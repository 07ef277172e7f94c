"""The context lookup's Triton kernels (kestrel/ops/lookup_triton.py: the step, the step choosing the drafts, the
append) against the torch formulation (kestrel.spec.lookup), on CUDA or under the Triton interpreter."""

import pytest
import torch

from kestrel.ops import reference_ops
from kestrel.spec import lookup as L
from tests.gpu.kernel_common import DEV, KERNEL_MARKS
from tests.spec.test_lookup import _sequences

pytestmark = KERNEL_MARKS


def _windows(width: int, rows: int = 400, seed: int = 4):
    """Windows of every fill with repeats at every n, each row's x0 (mostly its own last token, so loops go on) and
    real flags (about one padding row in ten)."""
    seqs = _sequences(3, rows, width + 8)
    g = torch.Generator().manual_seed(seed)
    window = torch.stack([L.fill_window(s, width) for s in seqs]).to(DEV)
    x0 = torch.tensor([s[-1] if s and i % 3 else int(torch.randint(0, 40, (1,), generator=g))
                       for i, s in enumerate(seqs)]).to(DEV)
    real = (torch.rand(len(seqs), generator=g) < 0.9).to(DEV)
    return window, x0, real


@pytest.mark.parametrize("width,gamma", [(16, 4), (256, 7)])
def test_lookup_step_kernel_equals_torch(width, gamma):
    """Windows, drafts and found flags equal the torch append + lookup exactly, for real and padding rows, over
    windows of every fill with repeats at every n."""
    from kestrel.ops import lookup_triton as K

    window, x0, real = _windows(width)
    got = K.step(window, x0, real, gamma, L.MIN_N, L.MAX_N)
    with reference_ops():
        new = L.append(window, x0.view(-1, 1), real.long())
        want = (new, *L.lookup(new, gamma))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    found = want[2]
    assert torch.equal(got[1][found], want[1][found])
    assert 0 < int(found.sum()) < len(found)


@pytest.mark.parametrize("width,gamma", [(16, 4), (256, 7)])
def test_lookup_select_kernel_equals_torch(width, gamma):
    """The step that also chooses each block's drafts: the lookup's where it found one and the confidence is below
    the threshold, the drafter's elsewhere; equal to torch's step + where, with confidences on both sides of the
    threshold and exactly at it (not below: the drafter's drafts)."""
    from kestrel.ops import lookup_triton as K

    window, x0, real = _windows(width, seed=5)
    B = window.shape[0]
    g = torch.Generator().manual_seed(6)
    drafts = torch.randint(1000, 2000, (B, gamma), generator=g).to(DEV)  # never a window token: tells the two apart
    conf = torch.rand(B, generator=g).to(DEV)
    conf[::7] = 0.7
    win, tokens = K.select(window, x0, real, gamma, drafts, conf, 0.7, L.MIN_N, L.MAX_N)
    with reference_ops():
        want_win, want = L.select(window, x0, real, gamma, drafts, conf, 0.7)
        found = L.step(window, x0, real, gamma)[2]
    assert torch.equal(win, want_win) and torch.equal(tokens, want)
    took = (tokens < 1000).all(1)
    assert torch.equal(took, found & (conf < 0.7))
    assert 0 < int(took.sum()) < int(found.sum())  # both sides of the threshold among the rows that found one


@pytest.mark.parametrize("width,k", [(16, 8), (256, 8), (256, 3)])
def test_lookup_append_kernel_equals_torch(width, k):
    """The accepted drafts into the windows: equal to torch's append, counts 0 .. k and beyond k (clamped)."""
    from kestrel.ops import lookup_triton as K

    window, _, _ = _windows(width)
    B = window.shape[0]
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 50, (B, k), generator=g).to(DEV)
    count = torch.randint(0, k + 3, (B,), generator=g).to(DEV)
    with reference_ops():
        want = L.append(window, tokens, count)
    assert torch.equal(K.append(window, tokens, count), want)
    assert torch.equal(K.append(window, tokens, count.to(torch.int32)), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the dispatch serves CUDA tensors")
def test_lookup_dispatch_serves_cuda():
    """On CUDA, lookup.step / select / append go to the kernels (the torch path would be the same code)."""
    from kestrel.ops import kernel

    window = L.empty_window(device="cuda").view(1, -1)
    for name in ("step", "select", "append"):
        assert kernel("kestrel.ops.lookup_triton", name, window) is not None
