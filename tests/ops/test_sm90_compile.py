"""The sm_90 compile check of the Triton kernels (tests/gpu/sm90.py, `make kernel-check`) on this CPU: it must catch
what the interpreter misses, and the kernel tests' launches must compile for the H100 / H200."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# a dev dependency: without it the check fails here rather than skipping itself away
assert importlib.util.find_spec("triton") is not None, "triton (in the dev extras) is not installed"
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}

PROBE = """
import sys, torch
from tests.gpu import sm90, sm90_probe as P
if sys.argv[1] == "hook":
    sm90.install()
x, y, out = torch.arange(16, dtype=torch.int32), torch.rand(16), torch.empty(16)
P.probe_kernel[(1,)](x, y, out, WIDE=sys.argv[2] == "wide", PDL=False)
assert torch.equal(out, x.float() if sys.argv[2] == "wide" else y)
print(sorted(set(sm90.seen.values())), len(sm90.seen))
"""


def _probe(*argv):
    return subprocess.run([sys.executable, "-c", PROBE, *argv], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_compile_check_catches_what_the_interpreter_runs():
    plain = _probe("plain", "wide")
    assert plain.returncode == 0, plain.stderr[-2000:]  # the interpreter runs the kernel (and gets it right)
    hooked = _probe("hook", "wide")
    assert hooked.returncode != 0 and "Inconsistent return types" in hooked.stderr, hooked.stderr[-2000:]
    narrow = _probe("hook", "narrow")  # the other specialisation compiles, with PDL off and on: two compiles
    assert narrow.returncode == 0 and "['probe_kernel'] 2" in narrow.stdout, narrow.stdout + narrow.stderr[-2000:]


# one or a few cases of every kernel family (the interpreter is slow: the whole of tests/gpu takes ~27 minutes on two
# cores, most of it in the GEMV tests' large weights; `make kernel-check` runs it all): ~115 s on one core
SUBSET = [
    "tests/gpu/test_kernels.py::test_norms",
    "tests/gpu/test_kernels.py::test_attn_res_settle[partial+delta-6-dtype1]",
    "tests/gpu/test_kernels.py::test_kda_decode",
    "tests/gpu/test_kernels.py::test_kda_verify_and_fold[True-True-False-True--5.0-dtype1]",
    "tests/gpu/test_kernels.py::test_kda_verify_and_fold[True-True-True-True--5.0-dtype1]",
    "tests/gpu/test_kernels.py::test_kda_prep_channels_first_equals_taps_first",
    "tests/gpu/test_kernels.py::test_kda_chunked",
    "tests/gpu/test_kernels.py::test_mla_decode[1-dtype0]",
    "tests/gpu/test_kernels.py::test_store_latent[None-dtype1]",
    "tests/gpu/test_kernels.py::test_head_gemv",
    "tests/gpu/test_kernels.py::test_mla_decode_project[3-dtype0]",
    "tests/gpu/test_kernels.py::test_attention_with_lse[True-dtype0]",
    "tests/gpu/test_moe_kernels.py::test_route",
    "tests/gpu/test_moe_kernels.py::test_moe_experts_up_and_down_in_one_launch[False]",
    "tests/gpu/test_moe_kernels.py::test_moe_experts[situ-True-dtype0]",
    "tests/gpu/test_moe_kernels.py::test_moe_up_activation_spread_over_threads[situ]",
    "tests/gpu/test_moe_kernels.py::test_moe_up_gemv_computes_the_shared_experts_activation[situ]",
    "tests/gpu/test_kernels.py::test_kda_decode_computes_the_output_gate[dtype1]",
    "tests/gpu/test_kernels.py::test_argmax_kernel_is_torch_argmax",
    "tests/gpu/test_linear_kernels.py::test_linear_prologue[situ-3-dtype1]",
    "tests/gpu/test_linear_kernels.py::test_linear_prologue[gated_rms-3-dtype1]",
    "tests/gpu/test_linear_kernels.py::test_linear_prologue[rms-3-dtype1]",
    "tests/gpu/test_linear_kernels.py::test_linear_pair[same-1-dtype1]",
    "tests/gpu/test_linear_kernels.py::test_linear_stacked",
    "tests/gpu/test_dspark_kernels.py::test_dspark_block_attention[8-dtype1]",
    "tests/gpu/test_dspark_kernels.py::test_dspark_accept_greedy[1024-dtype1]",
    "tests/gpu/test_dspark_kernels.py::test_dspark_correction[dtype1]",
    "tests/gpu/test_dspark_kernels.py::test_dspark_block_front_and_decode_keys[dtype1]",
    "tests/gpu/test_dspark_kernels.py::test_dspark_step_inputs[1]",
    "tests/gpu/test_lookup_gpu.py::test_lookup_append_kernel_equals_torch[16-8]",
]


@pytest.mark.slow
def test_kernel_tests_compile_for_sm90():
    """Each listed kernel test passes under the interpreter with every kernel it launches compiled for sm_90 (and
    its PDL twin) by Triton's compiler."""
    env = {**ENV, "KESTREL_SM90_COMPILE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *SUBSET],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = r.stdout.strip().splitlines()[-1]
    # (the interpreter's numpy may warn, e.g. an exp overflowing on a random input: "N passed, 1 warning in ...")
    assert re.fullmatch(r"\d+ passed(, \d+ warnings?)? in .*", summary) and int(summary.split()[0]) >= len(SUBSET), \
        r.stdout[-2000:]
    compiled = re.search(r"sm_90 compiles: (\d+) specialisations of (\d+) kernels", r.stdout)
    assert compiled and int(compiled.group(2)) >= 25, r.stdout[-2000:]  # the hook ran: 37 kernels in the subset


SETTLE_IR = """
import torch
from tests.gpu import sm90
sm90.kept = []
sm90.install()
from kestrel.ops.attn_res import triton as K
D, g = 2048, torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
K.attn_res_settle([r(1, D) for _ in range(6)], r(1, D), r(1, D), r(D), r(D), 1e-6, r(D), 1e-6, early=True)
for k in sm90.kept:
    print("convert_layout", *sm90.layout_counts(k))
"""


def test_the_settle_compiles_without_layout_conversions():
    """The AttnRes settle keeps every vector in its [values, D] tile's layout: a layout conversion is a round trip
    through shared memory, one per bank value when the values were 1-D, and the settle of 6 values cost 2 us more
    a decode step's link that way (docs/kernels.md, 2026-12-07 14:30). k3-mini's shape, compiled for sm_90 with PDL
    off and on."""
    r = subprocess.run([sys.executable, "-c", SETTLE_IR], env=ENV, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = [line.split() for line in r.stdout.splitlines() if line.startswith("convert_layout")]
    assert len(counts) == 2 and all(c[1] == "0" for c in counts), r.stdout


PREP_IR = """
import torch
from tests.gpu import sm90
sm90.kept = []
sm90.install()
from kestrel.ops.kda import triton_conv
B, H, Kd, W = 1, 16, 128, 4
C, g = 3 * H * Kd, torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
for L in (1, 8):
    triton_conv.launch_prep(r(B, L, C), r(C, W), r(2, W - 1, C), torch.tensor([1]), r(B, L, H, Kd), r(H).float(),
                            r(H * Kd).float(), -5.0, Kd**-0.5, H, Kd, Kd, write_tail=L == 1, beta_logits=r(B * L, H))
for k in sm90.kept:
    print("prep", *sm90.layout_counts(k), "fma" in k.asm["ptx"])
"""


def test_the_kda_prep_compiles_without_layout_conversions_or_fused_multiply_adds():
    """The KDA prep kernel at k3-mini's shapes (decode and an 8-step verify, PDL off and on), compiled for sm_90:
    its channel-column form has no layout conversion (the window form had 6, and 48 barriers after the wait), and no
    fused multiply-add: contracted, the conv's rounded bf16 product and its sum became one fma.rn.bf16, differently
    in decode and verify, whose outputs must be bit-equal (docs/kernels.md, 2026-12-07 16:37)."""
    r = subprocess.run([sys.executable, "-c", PREP_IR], env=ENV, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = [line.split() for line in r.stdout.splitlines() if line.startswith("prep")]
    assert len(counts) == 4 and all(c[1] == "0" and c[4] == "False" for c in counts), r.stdout
