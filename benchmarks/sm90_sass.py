"""Instructions the decode chain's kernels issue after their PDL wait, from their sm_90 SASS, on any machine (issue 9).

Under programmatic dependent launch a decode kernel streams its weights before `griddepcontrol.wait` (SASS
`ACQBULK`); what it issues after the wait is latency on the step's chain, and at batch 1 the MoE and projection
kernels are issue-bound there (Nsight, docs/kernels.md 2026-12-01). This compiles the kernels straight from their
arguments at k3-mini's batch-1 shapes (tests/gpu/sm90.py's hook, PDL on; no kernel runs), disassembles each cubin
with the `nvdisasm` in Triton's wheel and prints, per kernel, the instructions before and after the wait, the
barriers after it and the commonest opcodes after it. Counts, not a profile: what a change removes from every
warp's path after the wait, to be timed on the device (benchmarks/decode_knobs.py).

    PYTHONPATH=. python benchmarks/sm90_sass.py                 # the table
    PYTHONPATH=. python benchmarks/sm90_sass.py --ops 12        # with the 12 commonest opcodes after each wait
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"  # the kernels as InterpretedFunctions, which the hook compiles
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tests.gpu import sm90  # noqa: E402

# k3-mini: hidden 2048, latent 1024, 128 experts top-8 of width 512, 2 shared (1024 wide together)
E, LAT, I, TOPK, HID, SH = 128, 1024, 512, 8, 2048, 1024


def _bf(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def _expert_up(**knobs):
    from kestrel.ops.moe import triton as K
    x, w = _bf(1, LAT), _bf(E, I, LAT)
    args = (x, x, w, w, w, w, _bf(TOPK, I), torch.zeros(1, E), torch.zeros(E), E, 2.5, LAT, I, TOPK, 4.0, 25.0)
    kw = dict(BI=K.GEMV_UP_ROWS[1], BK=LAT, QUANT=False, SITU=True, IDS_READY=True, ROUTE=True, HAS_BIAS=True,
              RENORM=True, BE=E, num_warps=K.UP_WARPS, PDL=False, **knobs)
    return K._gemv_up_kernel, args, kw


def _expert_up_side():
    front = _bf(1, 3 * SH)
    return _expert_up(sa_ptr=front[:, SH : 2 * SH], sb_ptr=front[:, 2 * SH :], so_ptr=_bf(1, SH), SN=SH, s_len=SH,
                      sa_stride=3 * SH, sb_stride=3 * SH, SIDE=True, SB=128)


def _expert_down():
    from kestrel.ops.moe import triton as K
    h, w2 = _bf(TOPK, I), _bf(E, LAT, I)
    args = (h, h, h, w2, w2, _bf(1, LAT), torch.zeros(1, E), torch.zeros(E), E, 2.5, LAT, I, TOPK)
    kw = dict(BN=K.GEMV_DOWN_ROWS, BK=I, QUANT=False, IDS_READY=True, LATE_TRIGGER=False, ROUTE=True, HAS_BIAS=True,
              RENORM=True, BE=E, num_warps=4, PDL=False)
    return K._gemv_down_kernel, args, kw


def _pair(pro_b: int):
    """The paired MoE tail: the latent up projection (RMSNorm prologue) + the shared experts' down (pro_b)."""
    from kestrel.ops.linear import triton as L
    xa, xb, wa, wb = _bf(1, LAT), _bf(1, SH), _bf(HID, LAT), _bf(HID, SH)
    args = (xa, xa, _bf(LAT), wa, LAT, LAT, 1e-6, xb, xb, wb, wb, SH, SH, 0.0, 4.0, 25.0, _bf(1, HID), 1, HID)
    BN = L._tile(HID, LAT)[0]
    kw = dict(KA=LAT, KPA=LAT, PRO_A=L.RMS, KB=SH, KPB=SH, PRO_B=pro_b, SITU=True, BM=1, BN=BN, PDL=False,
              LATE_TRIGGER=True, ROW_GRID=0, num_stages=1, num_warps=4)
    return L._gemv_pair_kernel, args, kw


def _gemv(pro: int, N: int = HID, K: int = HID, group: int = 128):
    """A one-row whole-tile GEMV [N, K] with prologue kind `pro` (kestrel.ops.linear.triton NONE .. GATE)."""
    from kestrel.ops.linear import triton as L
    x, y = _bf(1, K), _bf(1, N)
    BN, BK, whole = L._tile(N, K)
    x2 = torch.zeros(1, K) if pro == L.GATED_RMS_SIG else _bf(1, K)  # (the sigmoid read in fp32)
    nw = _bf(group if pro in (L.GATED_RMS, L.GATED_RMS_SIG) else K)
    args = (x, _bf(N, K), y, y, x2, nw, 1, N, N, K, K, 1e-6, 4.0, 25.0)
    kw = dict(K=K, BM=1, BN=BN, BK=BK, HAS_ADD=False, PDL=False, PREFETCH=whole, PRO=pro, SITU=True, GROUP=group,
              STACKED=False, LATE_TRIGGER=True, ROW_GRID=0, num_stages=1,
              num_warps=8 if whole and BN * whole >= 16384 else 4)
    return L._gemv_kernel, args, kw


def cases():
    from kestrel.ops.linear import triton as L
    return [
        ("expert up GEMV (routing in the kernel)", lambda: _expert_up()),
        ("expert up GEMV, ACT_SPREAD", lambda: _expert_up(ACT_SPREAD=True)),
        ("expert up GEMV carrying the shared activation", _expert_up_side),
        ("expert down GEMV", _expert_down),
        ("paired MoE tail, SiTU prologue", lambda: _pair(L.ACT)),
        ("paired MoE tail, input as it is", lambda: _pair(L.NONE)),
        ("GEMV 2048 x 2048, no prologue", lambda: _gemv(L.NONE)),
        ("GEMV 2048 x 2048, gated RMSNorm (KDA o_proj)", lambda: _gemv(L.GATED_RMS)),
        ("GEMV 2048 x 2048, gated RMSNorm, the gate's sigmoid read", lambda: _gemv(L.GATED_RMS_SIG)),
        ("GEMV 2048 x 2048, output gate (MLA o_proj)", lambda: _gemv(L.GATE)),
        ("GEMV 2048 x 2048, RMSNorm", lambda: _gemv(L.RMS)),
    ]


def sass(kernel) -> list[str]:
    """The instructions of a compiled kernel's cubin, in order."""
    import triton.backends.nvidia as nv

    exe = os.path.join(os.path.dirname(nv.__file__), "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([exe, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].strip() for line in out.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]


def opcode(ins: str) -> str:
    words = ins.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0].rstrip(";")


def count(kernel) -> tuple[int, int, int, collections.Counter]:
    """(instructions before the wait, after it, barriers after it, opcodes after it) of a PDL-compiled kernel."""
    ins = sass(kernel)
    wait = next(i for i, s in enumerate(ins) if s.startswith("ACQBULK"))
    after = ins[wait:]
    ops = collections.Counter(opcode(s) for s in after)
    return wait, len(after), ops["BAR"], ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=0, help="list this many of the commonest opcodes after each wait")
    args = ap.parse_args()
    print("| kernel (k3-mini, batch 1, PDL) | before the wait | after the wait | barriers after |")
    print("|---|---|---|---|")
    notes = []
    for name, make in cases():
        sm90.kept = []
        fn, a, kw = make()
        sm90.compile_launch(fn, a, kw)
        kernel = next(k for k in sm90.kept if k.metadata.launch_pdl)
        before, after, bars, ops = count(kernel)
        print(f"| {name} | {before} | {after} | {bars} |")
        if args.ops:
            notes.append(f"{name}: " + ", ".join(f"{o} {n}" for o, n in ops.most_common(args.ops)))
    for line in notes:
        print(line)


if __name__ == "__main__":
    main()
