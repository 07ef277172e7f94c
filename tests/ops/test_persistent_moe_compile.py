"""The one-launch form of the persistent MoE block (kestrel.ops.moe.persistent) compiled for sm_90 on this CPU: the
interpreter runs only its staged form, so this is what checks the form the GPU runs before any GPU does. It must
compile, fit one program of 16 warps an SM without spilling more than a few bytes (a grid of one program an SM must
be resident at once, or its first barrier waits forever), and carry its barriers as acquire polls and release
arrivals."""

import importlib.util
import os
import re
import subprocess

import pytest

assert importlib.util.find_spec("triton") is not None, "triton (in the dev extras) is not installed"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, compile  # noqa: E402

from kestrel.ops.moe.persistent import _moe_block_kernel, _pow2_ceil_div  # noqa: E402

POINTERS = dict(x_ptr="*bf16", wr_ptr="*fp32", bias_ptr="*fp32", lg_ptr="*fp32", wf_ptr="*bf16", f_ptr="*bf16",
                w1_ptr="*bf16", w3_ptr="*bf16", hp_ptr="*bf16", w2_ptr="*bf16", yl_ptr="*bf16", nw_ptr="*bf16",
                wu_ptr="*bf16", wsd_ptr="*bf16", out_ptr="*bf16", sync_ptr="*i32")
SCALARS = dict(E="i32", scaling="fp32", eps="fp32", beta="fp32", lbeta="fp32")


def _ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers, spill store bytes) a thread, from the ptxas Triton ships."""
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    out = subprocess.run([exe, "-v", f"-arch={arch}", "-", "-o", os.devnull], input=ptx, capture_output=True,
                         text=True, check=True, timeout=300).stderr
    spills = re.search(r"(\d+) bytes spill stores", out)
    return int(re.search(r"Used (\d+) registers", out).group(1)), int(spills.group(1)) if spills else 0


@pytest.mark.parametrize("l2", [False, True])
def test_one_launch_form_compiles_for_sm90_with_one_program_an_sm(l2):
    # k3-mini's block on a 132-SM H100 / H200: D 2048, latent 1024, two shared experts of 512, 128 experts of 512, top-8
    D, L, S, I, E, TOPK, G, warps = 2048, 1024, 1024, 512, 128, 8, 132, 16
    tiles = dict(RB=_pow2_ceil_div(E, G), FB=_pow2_ceil_div(L + 2 * S, G), UB=_pow2_ceil_div(TOPK * I, G),
                 DB=_pow2_ceil_div(L, G), TB=_pow2_ceil_div(D, G))
    consts = dict(D=D, DP=D, L=L, LP=L, S=S, SP=S, I=I, IP=I, TOPK=TOPK, BE=E, RENORM=True, SITU=True, STAGE=-1,
                  PDL=True, L2=l2, **tiles)
    names = [p.name for p in _moe_block_kernel.params]
    signature = {n: POINTERS.get(n) or SCALARS.get(n) or "constexpr" for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in POINTERS}
    k = compile(ASTSource(_moe_block_kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                options={"num_warps": warps})
    ptx = k.asm["ptx"]
    # 16 warps a program cap a thread at 128 registers (one program an SM): what does not fit spills. A few bytes
    # do now (16-32); a tile grown past the registers spills kilobytes (the 114-SM layout, 64 rows an up tile: 1260)
    regs, spilled = _ptxas_usage(ptx)
    assert regs * 32 * warps <= 65536 and spilled <= 256, (regs, spilled)
    assert re.search(r"ld\.global\.gpu\.acquire|atom\.global\.gpu\.acquire", ptx), "the barrier's poll lost acquire"
    assert "release" in ptx, "the barrier's arrival lost release"
    assert ("prefetch.global.L2" in ptx) == l2
    assert "griddepcontrol.wait" in ptx
