"""Triton MoE: a register-resident top-k router, and routed experts with the activation fused in.

Experts, small batches (token x expert pairs <= GEMV_MAX_PAIRS): two GEMV launches that read each chosen
expert's weights in place (no gathered weight copies, no host sync): gate/up + activation per pair, then down
projection + weighted sum over the k experts per token. Large batches: a grouped GEMM over expert-sorted pairs
(kestrel.ops.moe.triton_grouped). MXFP4 experts are dequantised in-kernel (E2M1 nibbles, low = even column, E8M0
block scales).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import act as _act, act_input as _act_input, pdl_prologue

GEMV_MAX_PAIRS = 64
# GEMV tiles: rows of the gate/up projection per program (fewer / at least 8 pairs), rows of the down projection
# per program. Alone and cold (`benchmarks/kernels.py --sections cold`), (4, 2) streams the chosen experts at
# 1.70 TB/s against 1.41 for (8, 4); but inside the k3-mini decode graph, with the weights streamed before the
# wait, (8, 4) is 4% faster a step (`decode_ladder.py --tile-sweep`, 2026-12-01)
GEMV_UP_ROWS = (8, 8)
GEMV_DOWN_ROWS = 4
# the largest tiles (elements) loaded whole before the wait: up, per projection (w1 and w3 each); down, all k
# experts' tiles together (the one-row GEMV's register budget); warps per up program
UP_TILE_MAX, DOWN_TILE_MAX, UP_WARPS = 8192, 16384, 4
# the up GEMV's activation spread over the threads, one row each (_store_act SPREAD), not repeated by every thread
# for every row of its tile
ACT_SPREAD = False
# the up and down GEMVs as one launch (_gemv_updown_kernel): bit-equal, but 0.951x on k3-mini's batch-1 graph (H100,
# docs/kernels.md, 2026-12-05 23:53), so off
FUSED_UPDOWN = False


@triton.jit
def _choice(logits_ptr, bias_ptr, t, re, E, HAS_BIAS: tl.constexpr):
    """(sigmoid scores, selection scores) of experts `re` for token t; padding and NaN rows select last."""
    em = re < E
    scores = tl.sigmoid(tl.load(logits_ptr + t * E + re, mask=em, other=0.0).to(tl.float32))
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + re, mask=em, other=0.0).to(tl.float32)
    choice = tl.where(em, choice, -float("inf"))
    # NaN rows (padded graph rows) must still yield valid expert ids
    return scores, tl.where(choice == choice, choice, -float("inf"))


@triton.jit
def _route_row(logits_ptr, bias_ptr, t, E, scaling, TOPK: tl.constexpr, HAS_BIAS: tl.constexpr,
               RENORM: tl.constexpr, BE: tl.constexpr):
    """Token t's top-k experts ids [TOPK] (int64, best first; ties to the lower id) and their weights [TOPK] (fp32,
    renormalised and scaled). One bitonic top-k (tl.topk) over keys that pack each expert's selection score (its
    float bits mapped to an order-preserving integer) above its reversed id, so equal scores rank the lower id
    first: ~290 instructions a program where counting each expert's rank against blocks of the others took ~1110
    (k3-mini's up GEMV, sm_90 SASS), which the expert kernels' every program pays."""
    tl.static_assert(BE <= 65536)  # (the id's 16 bits of the key)
    re = tl.arange(0, BE)
    scores, choice = _choice(logits_ptr, bias_ptr, t, re, E, HAS_BIAS)
    bits = (choice + 0.0).to(tl.int32, bitcast=True)  # (+ 0.0: -0.0 ranks with +0.0)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-integer order = float order
    top = tl.topk((key.to(tl.int64) << 32) | (BE - 1 - re).to(tl.int64), TOPK)
    ids = tl.minimum(BE - 1 - (top & 0xFFFF), E - 1).to(tl.int64)
    wv = tl.sum(tl.where(re[:, None] == ids[None, :], scores[:, None], 0.0), 0)
    if RENORM:
        wv = wv / (tl.sum(wv, 0) + 1e-20)
    return ids, wv * scaling


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, E, scaling,
                  TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    ids, wv = _route_row(logits_ptr, bias_ptr, t, E, scaling, TOPK, HAS_BIAS, RENORM, BE)
    rk = tl.arange(0, TOPK)
    tl.store(ids_ptr + t * TOPK + rk, ids)
    tl.store(w_ptr + t * TOPK + rk, wv)


def route(logits, correction_bias, top_k, renormalize, scaling, num_expert_group=1, topk_group=1):
    """See reference.route; group-limited routing and non-power-of-2 top_k go to the reference (no host sync)."""
    if num_expert_group > topk_group or top_k & (top_k - 1) or logits.dtype == torch.float64:
        from kestrel.ops.moe.reference import route as ref
        return ref(logits, correction_bias, top_k, renormalize, scaling, num_expert_group, topk_group)
    T, E = logits.shape
    w = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    if T:
        BE = triton.next_power_of_2(E)
        _route_kernel[(T,)](logits.contiguous(), correction_bias if correction_bias is not None else logits,
                            w, ids, E, float(scaling), TOPK=top_k, HAS_BIAS=correction_bias is not None,
                            RENORM=bool(renormalize) and top_k > 1, BE=BE, num_warps=max(1, min(8, BE // 128)),
                            **pdl_args(logits))
    return w, ids


@triton.jit
def _e2m1(nib):
    """E2M1 nibble -> fp32: bit 3 sign, bits 1-2 exponent, bit 0 mantissa; {0, .5, 1, 1.5, 2, 3, 4, 6}."""
    e = (nib >> 1) & 3
    mant = (nib & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * mant, tl.exp2((e - 1).to(tl.float32)) * (1.0 + 0.5 * mant))
    return tl.where((nib & 8) != 0, -mag, mag)


@triton.jit
def _load_w(w_ptr, s_ptr, e, rows, cols, n_rows, n_cols, QUANT: tl.constexpr):
    """Expert e's weight tile [len(rows), len(cols)] (fp32): dense [E, n_rows, n_cols] or MXFP4 packed/scales."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    if QUANT:
        byte = tl.load(w_ptr + (e * n_rows + rows[:, None]) * (n_cols // 2) + cols[None, :] // 2, mask=mask, other=0)
        nib = tl.where((cols[None, :] % 2) == 0, byte & 15, byte >> 4).to(tl.int32)
        sc = tl.load(s_ptr + (e * n_rows + rows[:, None]) * (n_cols // 32) + cols[None, :] // 32, mask=mask, other=127)
        return _e2m1(nib) * tl.exp2(sc.to(tl.float32) - 127.0)
    return tl.load(w_ptr + (e * n_rows + rows[:, None]) * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _gemv_up_kernel(x_ptr, ids_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, lg_ptr, bias_ptr, E, scaling,
                    D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, beta, linear_beta, BI: tl.constexpr,
                    BK: tl.constexpr, QUANT: tl.constexpr, SITU: tl.constexpr, IDS_READY: tl.constexpr,
                    ROUTE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr,
                    PDL: tl.constexpr, ACT_SPREAD: tl.constexpr = False, sa_ptr=None, sb_ptr=None, so_ptr=None,
                    SN=1, s_len=0, sa_stride=0, sb_stride=0, SIDE: tl.constexpr = False, SB: tl.constexpr = 128):
    """IDS_READY (the routing finished before this kernel could start; see moe_experts): the expert ids are read
    and the whole weight tile loaded before waiting for x (BK >= D), so the stream overlaps the kernel before.
    ROUTE: the ids are chosen here from the router logits (see _route_row), not read. SIDE: another gated MLP's
    activation rides along (see _side_act)."""
    if PDL:
        gdc_launch_dependents()
        if not IDS_READY:
            gdc_wait()
    p = tl.program_id(0).to(tl.int64)  # (token, slot) pair
    ib = tl.program_id(1)
    t = p // TOPK
    e = _pair_expert(ids_ptr, lg_ptr, bias_ptr, E, scaling, p, t, TOPK, ROUTE, HAS_BIAS, RENORM, BE)
    rows = ib * BI + tl.arange(0, BI)
    if IDS_READY:
        a, b = _up_early(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, e, t, rows, D, I, BK, QUANT, PDL)
    else:
        a = tl.zeros([BI], tl.float32)
        b = tl.zeros([BI], tl.float32)
        # unrolled: every weight tile's load is in flight at once (the kernel is pure weight bandwidth)
        for k0 in tl.static_range(0, D, BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + t * D + cols, mask=cols < D, other=0.0).to(tl.float32)
            a += tl.sum(_load_w(w1_ptr, s1_ptr, e, rows, cols, I, D, QUANT) * x[None, :], 1)
            b += tl.sum(_load_w(w3_ptr, s3_ptr, e, rows, cols, I, D, QUANT) * x[None, :], 1)
    _store_act(h_ptr, p, rows, I, a, b, beta, linear_beta, SITU, ACT_SPREAD)
    if SIDE:
        _side_act(sa_ptr, sb_ptr, so_ptr, SN, s_len, sa_stride, sb_stride, beta, linear_beta, SITU, SB)


@triton.jit
def _side_act(sa_ptr, sb_ptr, so_ptr, SN, s_len, sa_stride, sb_stride, beta, linear_beta, SITU: tl.constexpr,
              SB: tl.constexpr):
    """The first programs of the launch (SB elements each, one a thread) also write act(a, b) of another gated
    MLP, rounded as its down projection's prologue would round it: a, b [rows, SN] (row-strided), so [rows, SN]
    contiguous, s_len = rows * SN. Called after the wait; the other programs skip it."""
    q = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if q * SB < s_len:
        n = q * SB + tl.arange(0, SB)
        on = n < s_len
        r, c = n // SN, n % SN
        a = tl.load(sa_ptr + r * sa_stride + c, mask=on, other=0.0)
        b = tl.load(sb_ptr + r * sb_stride + c, mask=on, other=0.0).to(tl.float32)
        y = _act_input(a.to(tl.float32), b, beta, linear_beta, SITU, a.dtype)
        tl.store(so_ptr + n, y.to(so_ptr.dtype.element_ty), mask=on)


@triton.jit
def _pair_expert(ids_ptr, lg_ptr, bias_ptr, E, scaling, p, t, TOPK: tl.constexpr, ROUTE: tl.constexpr,
                 HAS_BIAS: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr):
    """The expert of (token, slot) pair p: chosen here from the router logits (ROUTE), or read."""
    # one return of one type: the compiler types the unrouted load too (ids_ptr is then a stand-in of any dtype)
    if ROUTE:
        ids, _ = _route_row(lg_ptr, bias_ptr, t, E, scaling, TOPK, HAS_BIAS, RENORM, BE)
        e = tl.sum(tl.where(tl.arange(0, TOPK) == p % TOPK, ids, 0), 0)
    else:
        e = tl.load(ids_ptr + p).to(tl.int64)
    return e


@triton.jit
def _up_early(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, e, t, rows, D: tl.constexpr, I: tl.constexpr, BK: tl.constexpr,
              QUANT: tl.constexpr, PDL: tl.constexpr):
    """The gate and up products of expert e's rows for token t, the whole tile loaded before waiting for x."""
    cols = tl.arange(0, BK)
    w1 = _load_w(w1_ptr, s1_ptr, e, rows, cols, I, D, QUANT)
    w3 = _load_w(w3_ptr, s3_ptr, e, rows, cols, I, D, QUANT)
    if PDL:
        gdc_wait()
    x = tl.load(x_ptr + t * D + cols, mask=cols < D, other=0.0).to(tl.float32)
    return tl.sum(w1 * x[None, :], 1), tl.sum(w3 * x[None, :], 1)


@triton.jit
def _store_act(h_ptr, p, rows, I: tl.constexpr, a, b, beta, linear_beta, SITU: tl.constexpr,
               SPREAD: tl.constexpr = False):
    dt = h_ptr.dtype.element_ty
    if SPREAD:
        # the row sums come out of the reduction replicated (every thread holds all of them): passed through an
        # identity select, each thread keeps one row, so the activation runs once a thread, not once a row (exact:
        # the other terms are zeros)
        n: tl.constexpr = a.shape[0]
        eye = tl.arange(0, n)[:, None] == tl.arange(0, n)[None, :]
        ab = tl.sum(tl.where(eye[:, :, None], tl.join(a, b)[None, :, :], 0.0), 1)
        a, b = tl.split(ab)
    # the reference rounds each projection and the activation to the activation dtype
    y = _act(a.to(dt).to(tl.float32), b.to(dt).to(tl.float32), beta, linear_beta, SITU)
    tl.store(h_ptr + p * I + rows, y.to(dt), mask=rows < I)


@triton.jit
def _gemv_down_kernel(h_ptr, ids_ptr, wts_ptr, w2_ptr, s2_ptr, out_ptr, lg_ptr, bias_ptr, E, scaling,
                      D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      QUANT: tl.constexpr, IDS_READY: tl.constexpr, LATE_TRIGGER: tl.constexpr, ROUTE: tl.constexpr,
                      HAS_BIAS: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr, PDL: tl.constexpr):
    """IDS_READY (dense weights, TOPK a power of two, BK >= I): the k experts' [BN, I] tiles are loaded as one
    [k, BN, I] block before waiting for h; the k products are then summed as a tree, not in order. LATE_TRIGGER:
    dependents launch only after this kernel's wait. ROUTE: the ids and weights come from the router logits (see
    _route_row; TOPK a power of two)."""
    if PDL:
        if not LATE_TRIGGER:
            gdc_launch_dependents()
        if not IDS_READY:
            gdc_wait()
            if LATE_TRIGGER:
                gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    nb = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    dt = out_ptr.dtype.element_ty
    if IDS_READY:
        ev, wv = _token_experts(ids_ptr, wts_ptr, lg_ptr, bias_ptr, E, scaling, t, out_ptr, TOPK, ROUTE, HAS_BIAS,
                                RENORM, BE)
        acc = _down_early(h_ptr, w2_ptr, out_ptr, ev, wv, t, rows, D, I, TOPK, BK, LATE_TRIGGER, PDL, h_ptr, 0, False)
    else:
        if ROUTE:
            ev, wv = _route_row(lg_ptr, bias_ptr, t, E, scaling, TOPK, HAS_BIAS, RENORM, BE)
            wv = wv.to(dt).to(tl.float32)
        acc = tl.zeros([BN], tl.float32)
        # unrolled over the k experts and the inner width, summed in a fixed order (deterministic, no atomics)
        for j in tl.static_range(TOPK):
            p = t * TOPK + j
            if ROUTE:
                jm = tl.arange(0, TOPK) == j
                e = tl.sum(tl.where(jm, ev, 0), 0)
                wj = tl.sum(tl.where(jm, wv, 0.0), 0)
            else:
                e = tl.load(ids_ptr + p)
                wj = tl.load(wts_ptr + p).to(dt).to(tl.float32)
            y = tl.zeros([BN], tl.float32)
            for k0 in tl.static_range(0, I, BK):
                cols = k0 + tl.arange(0, BK)
                hv = tl.load(h_ptr + p * I + cols, mask=cols < I, other=0.0).to(tl.float32)
                y += tl.sum(_load_w(w2_ptr, s2_ptr, e, rows, cols, D, I, QUANT) * hv[None, :], 1)
            acc += y.to(dt).to(tl.float32) * wj
    tl.store(out_ptr + t * D + rows, acc.to(dt), mask=rows < D)


@triton.jit
def _token_experts(ids_ptr, wts_ptr, lg_ptr, bias_ptr, E, scaling, t, out_ptr, TOPK: tl.constexpr,
                   ROUTE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr):
    """Token t's k expert ids (int64) and weights (rounded to the output dtype, in fp32): chosen here or read."""
    dt = out_ptr.dtype.element_ty
    if ROUTE:
        ev, wv = _route_row(lg_ptr, bias_ptr, t, E, scaling, TOPK, HAS_BIAS, RENORM, BE)
    else:
        jj = tl.arange(0, TOPK)
        ev, wv = tl.load(ids_ptr + t * TOPK + jj).to(tl.int64), tl.load(wts_ptr + t * TOPK + jj)
    return ev, wv.to(dt).to(tl.float32)


@triton.jit
def _down_early(h_ptr, w2_ptr, out_ptr, ev, wv, t, rows, D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr,
                BK: tl.constexpr, LATE_TRIGGER: tl.constexpr, PDL: tl.constexpr, sync_ptr, NUP, SYNC: tl.constexpr):
    """The weighted down products of token t's k experts (ev, wv) for output rows `rows`: the k [BN, I] tiles loaded
    as one block before the wait, the k products summed as a tree. SYNC: h is written by NUP other programs of this
    launch (_gemv_updown_kernel): wait until their count (sync_ptr[1]) is complete, and read h from L2."""
    dt = out_ptr.dtype.element_ty
    jj = tl.arange(0, TOPK)
    cols = tl.arange(0, BK)
    w = tl.load(w2_ptr + (ev[:, None, None] * D + rows[None, :, None]) * I + cols[None, None, :],
                mask=(rows[None, :, None] < D) & (cols[None, None, :] < I), other=0.0)
    if PDL:
        gdc_wait()
        if LATE_TRIGGER:
            gdc_launch_dependents()
    hp = h_ptr + (t * TOPK + jj)[:, None] * I + cols[None, :]
    if SYNC:
        done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        while done < NUP:
            done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        hv = tl.load(hp, mask=cols[None, :] < I, other=0.0, cache_modifier=".cg")
    else:
        hv = tl.load(hp, mask=cols[None, :] < I, other=0.0)
    y = tl.sum(w.to(tl.float32) * hv.to(tl.float32)[:, None, :], 2)  # [TOPK, BN]
    return tl.sum(y.to(dt).to(tl.float32) * wv[:, None], 0)


@triton.jit
def _gemv_updown_kernel(x_ptr, ids_ptr, wts_ptr, w1_ptr, w3_ptr, w2_ptr, h_ptr, out_ptr, sync_ptr, lg_ptr, bias_ptr,
                        E, scaling, beta, linear_beta, D: tl.constexpr, I: tl.constexpr, DOUT: tl.constexpr,
                        TOPK: tl.constexpr, NP: tl.constexpr, BI: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr,
                        IP: tl.constexpr, SITU: tl.constexpr, ROUTE: tl.constexpr, HAS_BIAS: tl.constexpr,
                        RENORM: tl.constexpr, BE: tl.constexpr, LATE_TRIGGER: tl.constexpr, PDL: tl.constexpr):
    """The up and the down GEMV (their IDS_READY forms, dense weights) in one launch, so that the down programs
    stream their weight tiles while the up programs run, not after them. Each program takes a ticket as it starts
    (sync_ptr[0]): the first NP * NIB tickets do the up work and count themselves done (sync_ptr[1]); the rest do the
    down work, waiting for that count before they read h. A ticket is taken only by a running program, so every up
    ticket belongs to a program that will finish: the waits cannot deadlock, whatever the order programs start in.
    The arithmetic is the two kernels' (the same helpers): bit-identical outputs. The last program to finish
    (sync_ptr[2]) re-arms the counters for the next launch."""
    NIB: tl.constexpr = (I + BI - 1) // BI
    NNB: tl.constexpr = (DOUT + BN - 1) // BN
    NUP: tl.constexpr = NP * NIB
    TOTAL: tl.constexpr = NUP + NP // TOPK * NNB
    ticket = tl.atomic_add(sync_ptr, 1)
    if ticket < NUP:
        if PDL:
            gdc_launch_dependents()
        p = (ticket // NIB).to(tl.int64)
        t = p // TOPK
        e = _pair_expert(ids_ptr, lg_ptr, bias_ptr, E, scaling, p, t, TOPK, ROUTE, HAS_BIAS, RENORM, BE)
        up_rows = (ticket % NIB) * BI + tl.arange(0, BI)  # (each branch names its own: their shapes differ)
        a, b = _up_early(x_ptr, w1_ptr, w1_ptr, w3_ptr, w3_ptr, e, t, up_rows, D, I, DP, False, PDL)
        _store_act(h_ptr, p, up_rows, I, a, b, beta, linear_beta, SITU)
        tl.debug_barrier()  # every thread's h stores before the release
        tl.atomic_add(sync_ptr + 1, 1, sem="release")
    else:
        if PDL and not LATE_TRIGGER:
            gdc_launch_dependents()
        u = ticket - NUP
        t = (u // NNB).to(tl.int64)
        dn_rows = (u % NNB) * BN + tl.arange(0, BN)
        ev, wv = _token_experts(ids_ptr, wts_ptr, lg_ptr, bias_ptr, E, scaling, t, out_ptr, TOPK, ROUTE, HAS_BIAS,
                                RENORM, BE)
        acc = _down_early(h_ptr, w2_ptr, out_ptr, ev, wv, t, dn_rows, DOUT, I, TOPK, IP, LATE_TRIGGER, PDL, sync_ptr,
                          NUP, True)
        tl.store(out_ptr + t * DOUT + dn_rows, acc.to(out_ptr.dtype.element_ty), mask=dn_rows < DOUT)
    if tl.atomic_add(sync_ptr + 2, 1) == TOTAL - 1:
        tl.atomic_xchg(sync_ptr + 1, 0)
        tl.atomic_xchg(sync_ptr + 2, 0)
        tl.atomic_xchg(sync_ptr, 0)


def _sync(ew, device) -> torch.Tensor:
    """The fused up/down GEMV's three counters for this expert set (zero between launches: each launch re-arms
    them), allocated on first use (the engine's warm-up, before any graph capture)."""
    buf = getattr(ew, "_updown_sync", None)
    if buf is None or buf.device != device:
        buf = torch.zeros(3, dtype=torch.int32, device=device)
        ew._updown_sync = buf
    return buf


def _weights(ew, name):
    if ew.quantized:
        return getattr(ew, f"{name}_packed"), getattr(ew, f"{name}_scale")
    w = getattr(ew, name)
    return w, w


# tokens up to which the expert GEMVs route themselves: every program ranks its token's experts, so the cost grows
# with the programs per launch. Measured at one token (k3-mini decode: neutral to 7% faster a step); the k3-mini
# verify step (8 tokens, 4096 up programs) took 4.62-5.37 ms with it against 4.02 ms before (calls 4-6 of the
# 23:49 session), so more tokens route first (not re-measured on the H200 since)
ROUTE_IN_KERNEL_MAX_TOKENS = 1


def routes_in_kernel(logits, routing) -> bool:
    """Whether moe_experts_routed's expert GEMVs choose the experts themselves (see _route_row)."""
    k = routing.top_k
    return (logits.shape[0] <= ROUTE_IN_KERNEL_MAX_TOKENS and logits.shape[0] * k <= GEMV_MAX_PAIRS
            and routing.num_expert_group <= routing.topk_group and not k & (k - 1)
            and logits.dtype != torch.float64 and logits.shape[-1] >= k)


def moe_experts_routed(x, experts_weights, logits, routing, act, ids_ready: bool = False,
                       late_trigger: bool = False, shared=None):
    """See kestrel.ops.moe.experts_routed: the small-batch expert GEMVs choose the experts from the logits
    (no routing launch); other batches route first."""
    if x.dtype == torch.float64 or not routes_in_kernel(logits, routing):
        weights, ids = route(logits, routing.correction_bias, routing.top_k, routing.renormalize, routing.scaling,
                             routing.num_expert_group, routing.topk_group)
        return moe_experts(x, experts_weights, weights, ids, act, ids_ready, late_trigger, shared=shared)
    return moe_experts(x, experts_weights, None, None, act, ids_ready, late_trigger, (logits.contiguous(), routing),
                       shared)


def _side_fits(shared, x, programs: int) -> bool:
    """Whether an up GEMV launch of `programs` programs carries the activation of shared = (a, b) (_side_act)."""
    a, b = shared
    return (a.dim() == b.dim() == 2 and a.shape == b.shape and a.shape[0] == x.shape[0] and a.dtype == b.dtype
            == x.dtype and a.stride(-1) == b.stride(-1) == 1 and triton.cdiv(a.numel(), 32 * UP_WARPS) <= programs)


def moe_experts(x, experts_weights, weights, ids, act, ids_ready: bool = False, late_trigger: bool = False,
                routed=None, shared=None):
    """See kestrel.ops.moe.experts: x [T, D] -> [T, D_out] in x's dtype. routed: (logits, Routing) in place of
    weights and ids (see moe_experts_routed). shared: (a, b) of another gated MLP with the same activation; then
    returns (output, act(a, b) rounded as its down projection's prologue rounds it, or None where the up GEMV did
    not compute it)."""
    done = (lambda y, act_ab=None: (y, act_ab)) if shared is not None else (lambda y, act_ab=None: y)
    ew = experts_weights
    T, D = x.shape
    TOPK = ids.shape[1] if routed is None else routed[1].top_k
    I = ew.inter
    Dout = ew.hidden
    if x.dtype == torch.float64:
        from kestrel.ops.moe.reference import moe_experts as ref
        return done(ref(x, ew.dense("w1", x.dtype), ew.dense("w2", x.dtype), ew.dense("w3", x.dtype), weights, ids,
                        act))
    x = x.contiguous()
    if routed is None:
        ids, weights = ids.contiguous(), weights.contiguous()
        lg, bias, rt = x, None, None  # (unused)
    else:
        (lg, rt), ids, weights = routed, x, x  # (ids and weights unused)
        bias = rt.correction_bias
    route_args = dict(ROUTE=rt is not None, HAS_BIAS=bias is not None, BE=triton.next_power_of_2(lg.shape[-1]),
                      RENORM=rt is not None and bool(rt.renormalize) and TOPK > 1)
    route_ptrs = (lg, bias if bias is not None else lg, lg.shape[-1], float(rt.scaling) if rt is not None else 1.0)
    (w1, s1), (w2, s2), (w3, s3) = _weights(ew, "w1"), _weights(ew, "w2"), _weights(ew, "w3")
    q = bool(ew.quantized)
    situ = act.kind == "situ"
    NP = T * TOPK
    h = torch.empty(NP, I, dtype=x.dtype, device=x.device)
    if T == 0:
        return done(torch.empty(0, Dout, dtype=x.dtype, device=x.device))
    if NP <= GEMV_MAX_PAIRS:
        BI, BN = GEMV_UP_ROWS[NP >= 8], GEMV_DOWN_ROWS
        DP, IP = triton.next_power_of_2(D), triton.next_power_of_2(I)
        # tiles loaded whole before the wait only within the register budget
        up_early = ids_ready and BI * DP <= UP_TILE_MAX
        down_early = ids_ready and not q and TOPK & (TOPK - 1) == 0 and TOPK * BN * IP <= DOWN_TILE_MAX
        out = torch.empty(T, Dout, dtype=x.dtype, device=x.device)
        if FUSED_UPDOWN and up_early and down_early:
            grid = NP * triton.cdiv(I, BI) + T * triton.cdiv(Dout, BN)
            _gemv_updown_kernel[(grid,)](x, ids, weights, w1, w3, w2, h, out, _sync(ew, x.device), *route_ptrs,
                                         act.beta, act.linear_beta, D, I, Dout, TOPK,
                                         NP, BI, BN, DP, IP, SITU=situ, LATE_TRIGGER=late_trigger, **route_args,
                                         num_warps=UP_WARPS, **pdl_args(x))
            return done(out)
        side, act_ab = dict(sa_ptr=x, sb_ptr=x, so_ptr=x, SN=1, s_len=0, sa_stride=0, sb_stride=0, SIDE=False), None
        if shared is not None and _side_fits(shared, x, NP * triton.cdiv(I, BI)):
            a, b = shared
            act_ab = torch.empty(a.shape, dtype=a.dtype, device=a.device)
            side = dict(sa_ptr=a, sb_ptr=b, so_ptr=act_ab, SN=a.shape[1], s_len=a.numel(), sa_stride=a.stride(0),
                        sb_stride=b.stride(0), SIDE=True)
        _gemv_up_kernel[(NP, triton.cdiv(I, BI))](x, ids, w1, s1, w3, s3, h, *route_ptrs, D, I, TOPK, act.beta,
                                                 act.linear_beta, BI=BI, BK=DP if up_early else min(512, DP),
                                                 QUANT=q, SITU=situ, IDS_READY=up_early, **route_args,
                                                 ACT_SPREAD=ACT_SPREAD, **side, SB=32 * UP_WARPS,
                                                 num_warps=UP_WARPS,
                                                 **pdl_args(x))
        _gemv_down_kernel[(T, triton.cdiv(Dout, BN))](h, ids, weights, w2, s2, out, *route_ptrs, Dout, I, TOPK,
                                                      BN=BN, BK=IP if down_early else min(512, IP), QUANT=q,
                                                      IDS_READY=down_early, LATE_TRIGGER=late_trigger, **route_args,
                                                      num_warps=4, **pdl_args(h))
        return done(out, act_ab)
    from kestrel.ops.moe.triton_grouped import grouped_experts  # (it imports this module's tile loader)

    return done(grouped_experts(x, ids, weights, (w1, s1), (w2, s2), (w3, s3), h, act, q))


@triton.jit
def _activate_kernel(a_ptr, b_ptr, o_ptr, N, sa, sb, beta, linear_beta, SITU: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    a = tl.load(a_ptr + row * sa + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * sb + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * N + cols, _act(a, b, beta, linear_beta, SITU).to(o_ptr.dtype.element_ty), mask=m)


def activate(act, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """act(a, b) for [T, N] inputs (row-strided views allowed), computed in fp32 like the reference."""
    if a.dtype == torch.float64 or a.dim() != 2 or a.stride(-1) != 1 or b.stride(-1) != 1:
        return act(a, b)
    if act.kind == "silu":
        # the reference's SwiGLU rounds silu(a) before the product
        return torch.nn.functional.silu(a) * b
    T, N = a.shape
    out = torch.empty(T, N, dtype=a.dtype, device=a.device)
    BLOCK = min(1024, triton.next_power_of_2(N))
    if T:
        _activate_kernel[(T, triton.cdiv(N, BLOCK))](a, b, out, N, a.stride(0), b.stride(0), act.beta, act.linear_beta,
                                                   SITU=True, BLOCK=BLOCK, num_warps=4, **pdl_args(a))
    return out
