"""The drafter's GPU drafting path: its kernels' launch order under programmatic dependent launch."""

import pytest
import torch

from tests.spec.test_drafter import inputs, small_drafter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_drafts_pdl_graph_bit_equal_plain_launches(dtype, monkeypatch):
    """Greedy drafting (the step graph's drafting) captured in a CUDA graph with PDL on gives bit for bit the tokens
    and first confidence of plain launches: a correction kernel that read the previous position's state before the
    kernel writing it had finished (the early correction after a late-triggered vocabulary kernel) would race. The
    early correction's sums, in another order, give the same tokens as computing them after the wait."""
    import kestrel.ops as ops
    from kestrel.ops import dspark as dspark_ops

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    d = small_drafter(dtype=dtype).cuda()
    f, last = inputs(d, B=8)
    f, last = f.to("cuda", dtype), last.cuda()

    def drafted(pdl: bool, early: bool):
        monkeypatch.setattr(ops, "PDL", pdl)
        monkeypatch.setattr(dspark_ops, "EARLY_CORRECTION", early)
        d._greedy_drafts(f, last, 6, first_confidence=True)  # compile and make the folded head outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = d._greedy_drafts(f, last, 6, first_confidence=True)
        runs = []
        for _ in range(3):
            g.replay()
            torch.cuda.synchronize()
            runs.append((out.tokens.clone(), out.confidence.clone()))
        return runs

    plain, chained = drafted(False, True), drafted(True, True)
    for (t1, c1), (t2, c2) in zip(plain, chained):
        assert torch.equal(t1, t2) and torch.equal(c1, c2)
    late = drafted(True, False)[0]
    assert torch.equal(late[0], plain[0][0]) and late[0].shape == (8, 6)
    torch.testing.assert_close(late[1], plain[0][1], rtol=0, atol=1e-6 if dtype == torch.float32 else 2e-2)
