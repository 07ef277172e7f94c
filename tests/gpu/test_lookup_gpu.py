"""The context lookup step as one Triton kernel against the torch formulation (kestrel.spec.lookup), on CUDA."""

import pytest
import torch

from kestrel.spec import lookup as L
from tests.spec.test_lookup import _sequences

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("width,gamma", [(16, 4), (256, 7)])
def test_lookup_step_kernel_equals_torch(width, gamma):
    """Windows, drafts and found flags equal the torch append + lookup exactly, for real and padding rows, over
    windows of every fill with repeats at every n."""
    seqs = _sequences(3, 400, width + 8)
    g = torch.Generator().manual_seed(4)
    window = torch.stack([L.fill_window(s, width) for s in seqs]).cuda()
    x0 = torch.tensor([s[-1] if s and i % 3 else int(torch.randint(0, 40, (1,), generator=g))
                       for i, s in enumerate(seqs)]).cuda()
    real = (torch.rand(len(seqs), generator=g) < 0.9).cuda()
    got = L.step(window, x0, real, gamma)
    new = L.append(window, x0.view(-1, 1), real.long())
    want = (new, *L.lookup(new, gamma))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    found = want[2]
    assert torch.equal(got[1][found], want[1][found])
    assert 0 < int(found.sum()) < len(seqs)
    # the kernel served: the torch path would be the same code
    from kestrel.ops import kernel
    assert kernel("kestrel.ops.lookup_triton", "step", window) is not None
