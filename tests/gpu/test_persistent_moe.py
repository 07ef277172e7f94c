"""The MoE block as one persistent kernel (benchmarks/persistent_moe.py) against the model's MoE block: the staged
form (one launch a stage, the interpreter's) everywhere, and on a GPU the one-launch form with its grid barriers."""

import pytest
import torch

from benchmarks.persistent_moe import block_of, k3_moe
from tests.gpu.kernel_common import DEV, KERNEL_MARKS, SMALL, TOL, rel

pytestmark = KERNEL_MARKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_persistent_moe_block_equals_the_model_block(dtype):
    preset = "k3-tiny" if SMALL else "k3-mini"
    moe = k3_moe(preset, DEV, dtype, seed=3)
    programs = 8 if SMALL else torch.cuda.get_device_properties(DEV).multi_processor_count
    block = block_of(moe, programs)
    forms = [dict(stages=True)]
    if not SMALL:
        warps = 16
        assert block.resident(torch.empty(1, block.D, dtype=dtype, device=DEV), warps) >= programs
        forms.append(dict(stages=False, warps=warps))
    for _ in range(3):  # fresh inputs, the counters re-armed between launches
        x = torch.randn(1, block.D, device=DEV).to(dtype)
        with torch.no_grad():
            ref = moe(x)
        for form in forms:
            assert rel(block(x, **form), ref) < TOL[dtype], form
            assert block.sync.eq(0).all()
    # a wrong routing shows: the block with its correction bias moved onto other experts differs
    block.bias.add_(torch.arange(block.E, device=DEV, dtype=block.bias.dtype) * 10.0)
    assert rel(block(x, stages=True), ref) > 10 * TOL[dtype]


@pytest.mark.skipif(SMALL, reason="the model takes the persistent block on CUDA only")
def test_model_block_runs_the_persistent_launch_when_enabled(monkeypatch):
    from kestrel.ops import moe as moe_ops

    moe = k3_moe("k3-mini", DEV, torch.bfloat16, seed=5)
    x = torch.randn(1, moe.routed_expert_up_proj.weight.shape[0], device=DEV).to(torch.bfloat16)
    with torch.no_grad():
        ref = moe(x)
        monkeypatch.setattr(moe_ops, "PERSISTENT_BLOCK", True)
        out = moe(x)
        assert moe.persistent_block(x) is not None, "the persistent form was not taken"
        assert rel(out, ref) < TOL[torch.bfloat16]
        g = torch.cuda.CUDAGraph()  # captured (under PDL by the conftest default) and replayed on a new input
        with torch.cuda.graph(g):
            graphed = moe(x)
        x.copy_(torch.randn_like(x))
        g.replay()
        monkeypatch.setattr(moe_ops, "PERSISTENT_BLOCK", False)
        assert rel(graphed, moe(x)) < TOL[torch.bfloat16]
