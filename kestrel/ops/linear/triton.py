"""Triton GEMV for decode-sized batches (M <= 8): each program streams BN full weight rows in 16-byte loads and
keeps the M input rows in registers; no tensor cores (the work is pure weight bandwidth).

A program whose weight tile fits PREFETCH_MAX loads it whole, larger ones stream it BK columns at a time. Under
programmatic dependent launch (ops.pdl) the whole tile is loaded before the program waits for the previous kernel,
so the weight stream overlaps that kernel: `weight` must not be written by kernels still in flight on the stream
(model parameters never are).

A whole-tile program can also build its input from the previous op's outputs (a prologue, one launch fewer):
act(a, b) of a gated MLP, RMSNorm(x) * w, the per-head gated RMSNorm of KDA's output, or MLA's output gate
x * sigmoid(g). Every program recomputes
the (cheap, L2-resident) transform of the whole row; roundings follow the unfused kernels, so an elementwise
prologue is bit-equal to running them first.

`linear_pair` runs two whole-tile GEMVs whose outputs are summed (each with its own prologue) as one launch, each
product rounded as its own launch rounds it: bit-equal to the second GEMV adding the first's output.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import linear as dispatch
from kestrel.ops import pdl
from kestrel.ops.triton_utils import act_input as _act_input

# prologue kinds (the PRO constexpr)
NONE, ACT, RMS, GATED_RMS, GATE, GATED_RMS_SIG = 0, 1, 2, 3, 4, 5
KINDS = {"none": NONE, "act": ACT, "rms": RMS, "gated_rms": GATED_RMS, "gate": GATE,
         "gated_rms_sig": GATED_RMS_SIG}


@triton.jit
def _input_row(x_ptr, x2_ptr, nw_ptr, m, sx, sx2, cols, M, K: tl.constexpr, KP: tl.constexpr, eps, beta, lbeta,
               PRO: tl.constexpr, SITU: tl.constexpr, GROUP: tl.constexpr):
    """Row m of the GEMV input over `cols` (fp32), with the prologue applied (cols must cover the whole row unless
    PRO == NONE)."""
    on = (cols < K) & (m < M)
    x = tl.load(x_ptr + m * sx + cols, mask=on, other=0.0)
    dt = x.dtype
    xf = x.to(tl.float32)
    if PRO == 1:  # act(a, b) rounded as the unfused ops round it
        b = tl.load(x2_ptr + m * sx2 + cols, mask=on, other=0.0).to(tl.float32)
        xf = _act_input(xf, b, beta, lbeta, SITU, dt)
    elif PRO == 2:  # RMSNorm: normalised row rounded to x's dtype, then the weight, rounded again
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / K + eps)
        w = tl.load(nw_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        xf = ((xf * r).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
    elif PRO == 3 or PRO == 5:  # per group (head) of GROUP channels: RMSNorm * w * sigmoid(gate), fp32, one rounding
        g = tl.load(x2_ptr + m * sx2 + cols, mask=on, other=0.0).to(tl.float32)
        if PRO == 3:
            g = tl.sigmoid(g)  # (5: the second input holds sigmoid(gate) in fp32 already)
        sq = tl.reshape(xf * xf, [KP // GROUP, GROUP])
        r = 1.0 / tl.sqrt(tl.sum(sq, 1) / GROUP + eps)
        xr = tl.reshape(tl.reshape(xf, [KP // GROUP, GROUP]) * r[:, None], [KP])
        w = tl.load(nw_ptr + cols % GROUP).to(tl.float32)
        xf = (xr * w * g).to(dt).to(tl.float32)
    elif PRO == 4:  # x * sigmoid(gate), each op rounded to the activation dtype as torch's two ops round
        g = tl.load(x2_ptr + m * sx2 + cols, mask=on, other=0.0).to(tl.float32)
        xf = (xf * tl.sigmoid(g).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return xf


@triton.jit
def _dot_rows(acc, w, x_ptr, x2_ptr, nw_ptr, sx, sx2, cols, M, K: tl.constexpr, KP: tl.constexpr, eps, beta, lbeta,
              BM: tl.constexpr, PRO: tl.constexpr, SITU: tl.constexpr, GROUP: tl.constexpr):
    """acc[m, :] += w @ input[m, cols] for the M input rows (w: [BN, cols] fp32)."""
    rm = tl.arange(0, BM)
    for m in tl.static_range(BM):
        xm = _input_row(x_ptr, x2_ptr, nw_ptr, m, sx, sx2, cols, M, K, KP, eps, beta, lbeta, PRO, SITU, GROUP)
        part = tl.sum(w * xm[None, :], 1)
        acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, add_ptr, x2_ptr, nw_ptr, M, N, GN, sx, sx2, eps, beta, lbeta,
                 K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_ADD: tl.constexpr,
                 PDL: tl.constexpr, PREFETCH: tl.constexpr, PRO: tl.constexpr, SITU: tl.constexpr,
                 GROUP: tl.constexpr, STACKED: tl.constexpr, LATE_TRIGGER: tl.constexpr, ROW_GRID: tl.constexpr):
    nb, r = tl.program_id(0), tl.program_id(1)
    if ROW_GRID == 2:  # the rows on grid axis 0 (see _row_grid)
        nb, r = tl.program_id(1), tl.program_id(0)
    rows = nb * BN + tl.arange(0, BN)
    if ROW_GRID:  # one input row per program, each computed as a one-row launch computes it
        x_ptr += r * sx
        x2_ptr += r * sx2
        y_ptr += r * N
        add_ptr += r * N
    if STACKED:  # weights stacked in groups of GN rows, group j reading input columns [j K, (j + 1) K)
        x_ptr += (nb * BN // GN) * K
    rm = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    if PDL and not LATE_TRIGGER:
        gdc_launch_dependents()
    if PREFETCH:  # the whole [BN, K] tile in flight before the wait: only x depends on the previous kernel
        cols = tl.arange(0, PREFETCH)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                    mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0)
        if PDL:
            gdc_wait()
            if LATE_TRIGGER:
                gdc_launch_dependents()
        acc = _dot_rows(acc, w.to(tl.float32), x_ptr, x2_ptr, nw_ptr, sx, sx2, cols, M, K, PREFETCH, eps, beta,
                        lbeta, BM, PRO, SITU, GROUP)
    else:
        if PDL:
            gdc_wait()
            if LATE_TRIGGER:
                gdc_launch_dependents()
        for k0 in tl.static_range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                        mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0).to(tl.float32)
            acc = _dot_rows(acc, w, x_ptr, x2_ptr, nw_ptr, sx, sx2, cols, M, K, BK, eps, beta, lbeta, BM, 0, SITU,
                            GROUP)
    out_mask = (rm[:, None] < M) & (rows[None, :] < N)
    y = acc.to(y_ptr.dtype.element_ty)
    if HAS_ADD:  # y + add as torch would compute it after the GEMV: rounded product, then the rounded sum
        r = tl.load(add_ptr + rm[:, None] * N + rows[None, :], mask=out_mask, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * N + rows[None, :], y, mask=out_mask)


@triton.jit
def _gemv_pair_kernel(xa_ptr, xa2_ptr, nwa_ptr, wa_ptr, sxa, sxa2, eps_a, xb_ptr, xb2_ptr, nwb_ptr, wb_ptr, sxb, sxb2,
                      eps_b, beta, lbeta, y_ptr, M, N, KA: tl.constexpr, KPA: tl.constexpr, PRO_A: tl.constexpr,
                      KB: tl.constexpr, KPB: tl.constexpr, PRO_B: tl.constexpr, SITU: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr, LATE_TRIGGER: tl.constexpr,
                      ROW_GRID: tl.constexpr):
    """Two one-row GEMVs into one output, each rounded as its own launch would round it: round(round(A) +
    round(B)) with A = wa @ pro_a(xa), B = wb @ pro_b(xb). Both whole tiles are loaded before the wait."""
    nb, r = tl.program_id(0), tl.program_id(1)
    if ROW_GRID == 2:  # as in _gemv_kernel
        nb, r = tl.program_id(1), tl.program_id(0)
    rows = nb * BN + tl.arange(0, BN)
    if ROW_GRID:  # as in _gemv_kernel
        xa_ptr += r * sxa
        xa2_ptr += r * sxa2
        xb_ptr += r * sxb
        xb2_ptr += r * sxb2
        y_ptr += r * N
    rm = tl.arange(0, BM)
    if PDL and not LATE_TRIGGER:
        gdc_launch_dependents()
    ca = tl.arange(0, KPA)
    cb = tl.arange(0, KPB)
    wa = tl.load(wa_ptr + rows[:, None].to(tl.int64) * KA + ca[None, :], mask=(rows[:, None] < N) & (ca[None, :] < KA),
                 other=0.0)
    wb = tl.load(wb_ptr + rows[:, None].to(tl.int64) * KB + cb[None, :], mask=(rows[:, None] < N) & (cb[None, :] < KB),
                 other=0.0)
    if PDL:
        gdc_wait()
        if LATE_TRIGGER:
            gdc_launch_dependents()
    acc_a = _dot_rows(tl.zeros([BM, BN], tl.float32), wa.to(tl.float32), xa_ptr, xa2_ptr, nwa_ptr, sxa, sxa2, ca, M,
                      KA, KPA, eps_a, beta, lbeta, BM, PRO_A, SITU, 1)
    acc_b = _dot_rows(tl.zeros([BM, BN], tl.float32), wb.to(tl.float32), xb_ptr, xb2_ptr, nwb_ptr, sxb, sxb2, cb, M,
                      KB, KPB, eps_b, beta, lbeta, BM, PRO_B, SITU, 1)
    dt = y_ptr.dtype.element_ty
    y = (acc_b.to(dt).to(tl.float32) + acc_a.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + rm[:, None] * N + rows[None, :], y, mask=(rm[:, None] < M) & (rows[None, :] < N))


# (rows per program, K per step) override for benchmarks/kernels.py's tile sweep; None = the rule below
TILE = None
# rows per program up to N = 4096 outputs and above (the decode ladder's --tile-sweep times others in the model)
ROWS = (4, 8)
# the largest weight tile (elements) a program loads whole (before it waits, under PDL); larger ones stream by BK
PREFETCH_MAX = 16384


# a small weight with many short rows takes tiles of up to this many elements (more rows a program, at least
# SMALL_TILE_MIN_TILES tiles): fewer programs for a verify block's rows, each row in its own programs; 0: off.
# The tile depends on the weight's shape alone, so a row computes the same whatever rows come with it.
SMALL_TILE = 8192
SMALL_TILE_MIN_TILES = 128


def _tile(N: int, K: int) -> tuple[int, int, int]:
    """(rows per program, K step, whole-tile width or 0)."""
    BN, BK = TILE or (ROWS[N > 4096], 512)
    KP = triton.next_power_of_2(K)
    if TILE is None and SMALL_TILE and N * K <= dispatch.SMALL_WEIGHT:
        wide = min(SMALL_TILE // KP, N // SMALL_TILE_MIN_TILES)
        if wide > BN:
            BN = 1 << (wide.bit_length() - 1)
    return BN, min(BK, KP), KP if TILE is None and BN * KP <= PREFETCH_MAX else 0


# a large weight's products of 2 .. this many rows with each row in its own programs, the rows of one tile
# adjacent in launch order (so they share its L2 fill); above it, one program reduces its tile against every row.
# k3-mini's decode graph at batches 2 / 3 / 4: 1.025x / 1.13x / 1.05x faster than the latter (gemv_rows.py)
ROW_GRID_LARGE_MAX_M = 4


def _row_grid(M: int, weight: torch.Tensor) -> int:
    """Whether each of M > 1 input rows gets its own programs: 1 (grid axis 1) for a small weight, which they then
    read M times from L2, in place of one program reducing its tile against the rows one after another (a verify
    block's eight-row GEMVs took ~3.7 us that way on the H200 against ~1 us a one-row one); 2 (the rows on grid
    axis 0, the tiles on axis 1) for a large weight up to ROW_GRID_LARGE_MAX_M rows; 0 otherwise. Each row computes
    as a one-row launch does, so a row's output does not depend on the rows beside it."""
    if M <= 1:
        return 0
    if dispatch.small_weight(weight):
        return 1
    return 2 if M <= ROW_GRID_LARGE_MAX_M else 0


def _grid(tiles: int, M: int, row_grid: int) -> tuple[int, int]:
    """The launch grid for `tiles` weight tiles and M rows in _row_grid's mode."""
    return (M, tiles) if row_grid == 2 else (tiles, M if row_grid else 1)


def fits_prologue(N: int, K: int) -> bool:
    """Whether a GEMV of this shape loads its tile whole (the only form that takes a prologue)."""
    return _tile(N, K)[2] > 0


def linear(x: torch.Tensor, weight: torch.Tensor, add: torch.Tensor | None = None, pro=None,
           groups: int = 1, late_trigger: bool = False) -> torch.Tensor:
    """x [M <= 8, K] @ weight[N, K]^T (+ add [M, N], same dtype as the result) -> [M, N] in the wider dtype of
    the two (fp32 accumulation). pro: a kestrel.ops.linear.Prologue whose transform of x (rows may be strided) is
    the GEMV's input; the shape must fit_prologue. groups > 1: `groups` stacked layers over as many column groups
    of x (x [M, groups * K'], weight [groups * N', K']; see kestrel.ops.linear.linear_stacked). late_trigger:
    under PDL, let the next kernel launch only once this one has waited (so everything before this kernel has
    finished by then)."""
    M, K = x.shape
    N = weight.shape[0]
    assert M <= 8 and weight.is_contiguous() and K == groups * weight.shape[1] and N % groups == 0
    K = weight.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(M, N, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    BN, BK, prefetch = _tile(N, K)
    assert groups == 1 or ((N // groups) % BN == 0 and pro is None)
    use_pdl = pdl(x)
    assert pro is None or prefetch, "a prologue needs the whole-tile GEMV"
    kind, x2, nw, eps, beta, lbeta, situ, group = _pro_args(pro, x, weight)
    if M:
        if add is not None:
            assert add.shape == y.shape and add.dtype == y.dtype
            add = add.contiguous()
        row_grid = _row_grid(M, weight)
        _gemv_kernel[_grid(triton.cdiv(N, BN), M, row_grid)](
            x, weight, y, add if add is not None else y, x2, nw, 1 if row_grid else M, N, N // groups, x.stride(0),
            x2.stride(0), eps, beta, lbeta, K=K, BM=1 if row_grid else triton.next_power_of_2(M), BN=BN, BK=BK,
            HAS_ADD=add is not None, PDL=use_pdl, PREFETCH=prefetch, PRO=kind, SITU=situ, GROUP=group,
            STACKED=groups > 1, LATE_TRIGGER=late_trigger, ROW_GRID=row_grid, num_stages=1, launch_pdl=use_pdl,
            num_warps=8 if prefetch and BN * prefetch >= 16384 else 4)
    return y


def _pro_args(pro, x: torch.Tensor, weight: torch.Tensor):
    """(PRO kind, second input, norm weight, eps, beta, linear beta, SiTU, group) of a prologue (or None) for the
    GEMV kernels; unused pointers are x and weight."""
    if pro is None:
        return NONE, x, weight, 0.0, 1.0, 1.0, False, 1
    kind = KINDS[pro.kind]
    x2 = pro.other if pro.other is not None else x
    nw = pro.weight if pro.weight is not None else weight
    assert x2.stride(-1) == 1 and nw.is_contiguous()
    K = weight.shape[1]
    assert kind not in (GATED_RMS, GATED_RMS_SIG) or (K % pro.group == 0 and pro.group & (pro.group - 1) == 0)
    beta, lbeta, situ = 1.0, 1.0, False
    if pro.act is not None:
        beta, lbeta, situ = float(pro.act.beta), float(pro.act.linear_beta), pro.act.kind == "situ"
    return kind, x2, nw, float(pro.eps), beta, lbeta, situ, int(pro.group or 1)


def fits_pair(N: int, KA: int, KB: int) -> bool:
    """Whether linear_pair serves these shapes: each GEMV alone would load its whole tile, with the same warps
    (so each tile keeps the layout, and its sums the order, of its own launch)."""
    (BN, _, pa), (_, _, pb) = _tile(N, KA), _tile(N, KB)
    return pa > 0 and pb > 0 and (BN * pa >= 16384) == (BN * pb >= 16384)


def linear_pair(xa: torch.Tensor, wa: torch.Tensor, pro_a, xb: torch.Tensor, wb: torch.Tensor, pro_b,
                late_trigger: bool = False) -> torch.Tensor:
    """linear(pro_b(xb), wb, add=linear(pro_a(xa), wa)) in one launch, bit-equal to the two GEMVs when each tile
    has the layout its own launch gives it (same rows per program and warps): xa [M, KA], xb [M, KB], wa [N, KA],
    wb [N, KB]. The pair where a sublayer ends in two projections summed (the latent MoE's up projection and the
    shared experts' down projection): one kernel boundary fewer on the decode chain."""
    M, KA = xa.shape
    KB = xb.shape[1]
    N = wa.shape[0]
    assert M <= 8 and xb.shape[0] == M and wb.shape[0] == N and wa.shape[1] == KA and wb.shape[1] == KB
    assert wa.is_contiguous() and wb.is_contiguous() and xa.stride(-1) == 1 and xb.stride(-1) == 1
    assert fits_pair(N, KA, KB) and wa.dtype == wb.dtype == xa.dtype == xb.dtype
    ka, xa2, nwa, eps_a, beta_a, lbeta_a, situ_a, _ = _pro_args(pro_a, xa, wa)
    kb, xb2, nwb, eps_b, beta_b, lbeta_b, situ_b, _ = _pro_args(pro_b, xb, wb)
    assert not {GATED_RMS, GATED_RMS_SIG} & {ka, kb}, "a grouped prologue is not paired"
    assert ka != ACT or kb != ACT or (beta_a, lbeta_a, situ_a) == (beta_b, lbeta_b, situ_b)
    beta, lbeta, situ = (beta_a, lbeta_a, situ_a) if ka == ACT else (beta_b, lbeta_b, situ_b)
    y = torch.empty(M, N, dtype=xa.dtype, device=xa.device)
    BN = _tile(N, KA)[0]
    KPA, KPB = triton.next_power_of_2(KA), triton.next_power_of_2(KB)
    use_pdl = pdl(xa)
    if M:
        # each tile's warps as its own GEMV launch would have them (the same reduction order, so the same sums)
        warps = 8 if BN * max(KPA, KPB) >= 16384 else 4
        ga, gb = _row_grid(M, wa), _row_grid(M, wb)
        row_grid = ga if ga == gb else 0
        _gemv_pair_kernel[_grid(triton.cdiv(N, BN), M, row_grid)](
            xa, xa2, nwa, wa, xa.stride(0), xa2.stride(0), eps_a, xb, xb2, nwb, wb, xb.stride(0), xb2.stride(0), eps_b,
            beta, lbeta, y, 1 if row_grid else M, N, KA=KA, KPA=KPA, PRO_A=ka, KB=KB, KPB=KPB, PRO_B=kb, SITU=situ,
            BM=1 if row_grid else triton.next_power_of_2(M), BN=BN, PDL=use_pdl, LATE_TRIGGER=late_trigger,
            ROW_GRID=row_grid, num_stages=1, launch_pdl=use_pdl, num_warps=warps)
    return y
