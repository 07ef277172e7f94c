"""The paired one-row GEMV (triton._gemv_pair_kernel, the latent MoE's up projection plus the shared experts' down
projection) with its two weight tiles staged in shared memory before the PDL wait (Gluon): see
kestrel/ops/moe/staged.py for why. One input row, prologues none / act / rms; the tiles are read back in the
layout the Triton kernel computes in, so its sums run in the same order and the output is bit-equal to it.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from kestrel.ops.gluon_utils import act, gdc_launch_dependents, gdc_wait, row_layout, sigmoid

# the prologues served (triton's PRO kinds)
NONE, ACT, RMS = 0, 1, 2


@gluon.jit
def _input_row(x_ptr, x2_ptr, nw_ptr, cols, K: gl.constexpr, eps, beta, lbeta, PRO: gl.constexpr,
               SITU: gl.constexpr):
    """The one input row with its prologue applied (fp32), rounded as triton._input_row rounds it."""
    on = cols < K
    x = gl.load(x_ptr + cols, mask=on, other=0.0)
    dt: gl.constexpr = x.dtype
    xf = x.to(gl.float32)
    if PRO == 1:
        b = gl.load(x2_ptr + cols, mask=on, other=0.0).to(gl.float32)
        if SITU:
            xf = act(xf, b, beta, lbeta, SITU).to(dt).to(gl.float32)
        else:
            xf = ((xf * sigmoid(xf)).to(dt).to(gl.float32) * b).to(dt).to(gl.float32)
    elif PRO == 2:
        r = 1.0 / gl.sqrt(gl.sum(xf * xf, 0) / K + eps)
        w = gl.load(nw_ptr + cols, mask=on, other=0.0).to(gl.float32)
        xf = ((xf * r).to(dt).to(gl.float32) * w).to(dt).to(gl.float32)
    return xf


@gluon.jit
def _gemv_pair_staged_kernel(xa_ptr, xa2_ptr, nwa_ptr, wa_ptr, eps_a, xb_ptr, xb2_ptr, nwb_ptr, wb_ptr, eps_b, beta,
                             lbeta, y_ptr, KA: gl.constexpr, PRO_A: gl.constexpr, KB: gl.constexpr,
                             PRO_B: gl.constexpr, SITU: gl.constexpr, BN: gl.constexpr, TR: gl.constexpr,
                             TC: gl.constexpr, WR: gl.constexpr, WC: gl.constexpr, LATE_TRIGGER: gl.constexpr,
                             PDL: gl.constexpr):
    """y[rows] = round(round(wb[rows] @ pro_b(xb)) + round(wa[rows] @ pro_a(xa))), BN rows a program."""
    if PDL:
        if not LATE_TRIGGER:
            gdc_launch_dependents()
    tile: gl.constexpr = gl.BlockedLayout([1, 8], [TR, TC], [WR, WC], [1, 0])
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    rows = gl.program_id(0) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, tile))
    r2 = gl.expand_dims(rows.to(gl.int64), 1)
    ca = gl.arange(0, KA, layout=gl.SliceLayout(0, tile))
    cb = gl.arange(0, KB, layout=gl.SliceLayout(0, tile))
    sa = gl.allocate_shared_memory(wa_ptr.dtype.element_ty, [BN, KA], flat)
    sb = gl.allocate_shared_memory(wb_ptr.dtype.element_ty, [BN, KB], flat)
    async_copy.async_copy_global_to_shared(sa, wa_ptr + r2 * KA + gl.expand_dims(ca, 0))
    async_copy.async_copy_global_to_shared(sb, wb_ptr + r2 * KB + gl.expand_dims(cb, 0))
    async_copy.commit_group()
    if PDL:
        gdc_wait()
        if LATE_TRIGGER:
            gdc_launch_dependents()
    xa = _input_row(xa_ptr, xa2_ptr, nwa_ptr, ca, KA, eps_a, beta, lbeta, PRO_A, SITU)
    xb = _input_row(xb_ptr, xb2_ptr, nwb_ptr, cb, KB, eps_b, beta, lbeta, PRO_B, SITU)
    async_copy.wait_group(0)
    # (+ 0.0: the Triton kernel adds each row's sum to a zero accumulator, which turns a -0.0 into +0.0)
    acc_a = gl.sum(sa.load(tile).to(gl.float32) * gl.expand_dims(xa, 0), 1) + 0.0
    acc_b = gl.sum(sb.load(tile).to(gl.float32) * gl.expand_dims(xb, 0), 1) + 0.0
    dt: gl.constexpr = y_ptr.dtype.element_ty
    y = (acc_b.to(dt).to(gl.float32) + acc_a.to(dt).to(gl.float32)).to(dt)
    gl.store(y_ptr + rows, y)


def serves(M: int, N: int, KA: int, KB: int, BN: int, warps: int, kinds: tuple, dtype) -> bool:
    """Whether the staged pair takes this call: one row, 16-bit, whole row blocks, both widths powers of two that
    give the Triton kernel's layout (row_layout with every thread along the row), prologues none / act / rms."""
    def width(K):
        lay = row_layout(K, BN, warps)
        return K & (K - 1) == 0 and lay is not None and lay[0] == lay[2] == 1
    return (M == 1 and dtype.itemsize == 2 and N % BN == 0 and width(KA) and width(KB)
            and all(k in (NONE, ACT, RMS) for k in kinds))


def gemv_pair(a: tuple, b: tuple, beta: float, lbeta: float, situ: bool, y, BN: int, warps: int,
              late_trigger: bool, pdl: dict) -> None:
    """a, b: (x, x2, norm weight, eps, weight, PRO kind) of each GEMV; y [1, N] written in place."""
    (xa, xa2, nwa, eps_a, wa, ka), (xb, xb2, nwb, eps_b, wb, kb) = a, b
    KA, KB = wa.shape[1], wb.shape[1]
    tr, tc, wr, wc = row_layout(KA, BN, warps)
    _gemv_pair_staged_kernel[(wa.shape[0] // BN,)](xa, xa2, nwa, wa, eps_a, xb, xb2, nwb, wb, eps_b, beta, lbeta, y,
                                                   KA, ka, KB, kb, situ, BN, TR=tr, TC=tc, WR=wr, WC=wc,
                                                   LATE_TRIGGER=late_trigger, num_warps=warps, **pdl)
