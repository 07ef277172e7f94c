"""Triton chunked KDA prefill (WY form over 64-token chunks aligned to absolute positions), in five launches:

1. diagonal blocks + gates (parallel over chunks x heads x programs): per 16-row block, A_qk's diagonal block and
   the inverse (I + beta A_kk)^-1 of the block (product form), around the block's middle row (exponents <= 8 |g|);
   beside them, gate programs over column pieces write q exp(gc), k exp(gc_last - gc), beta k exp(gc), gc_last.
2. off-diagonal blocks (parallel over chunks x heads): A_qk's and A_kk's six 16 x 16 blocks below the diagonal,
   accumulated over pieces of K with every exponent <= 0, then the whole (I + A_kk)^-1 by block substitution.
3. w and u0 (parallel over chunks x heads): X = (I + A_kk)^-1 [beta k exp(gc) | beta v], the inverse read once.
4. recurrence (sequential over a sequence's chunks, parallel over heads x value blocks): u = u0 - w S;
   S <- exp(gc_last) S + (k exp(gc_last - gc))^T u. Writes each chunk's starting state h and u.
5. output (parallel): o = (scale q exp(gc)) h + A_qk u.

A chunk of safe gates summing to -320 never overflows. Exact for per-token gates >= -10 (twice the safe-gate
bound): beyond that the diagonal blocks' factors are clamped at e^80 and accuracy degrades gracefully instead of
overflowing. For bf16 / fp16 inputs (I + A_kk)^-1 is stored in that dtype (TILES["ainv_low"], as fla does: 1.13x
on the whole call at H = 96, 3e-3 relative on the output).
"""

import collections
import math

import torch
import triton
import triton.language as tl

from kestrel.ops import triton_interpreted
from kestrel.ops.kda.layout import chunk_table
from kestrel.ops.triton_utils import launch

# Launch shapes and precision choices (benchmarks/kernels.py --chunk-sweep tries others): warps of the diagonal
# and off-diagonal kernels (one each measured fastest; with four, ncu showed the diagonal kernel bound by L1 /
# shared-memory traffic at 86%), the off-diagonal kernel's K piece, the gate programs' columns, whether the 16 x 16
# inverse products run in tf32 for bf16 inputs (else fp32) and whether the inverse is stored in the activations'
# dtype; columns, split and warps of the w / u0 kernel; the recurrence's value-block width (below 128
# sequence-heads the narrower one, for more programs), warps and pipeline depth, and whether its programs start
# with the longest sequences.
TILES = {"diag_warps": 1, "intra_warps": 1, "intra_bk": 16, "gate_cols": 32, "inverse_tf32": True, "ainv_low": True,
         "wy_cols": 64, "wy_warps": 4, "wy_split": 1, "wy_stages": 3, "rec_bv": 64, "rec_bv_small": 32, "rec_warps": 4,
         "rec_stages": 2, "rec_longest_first": True}


@triton.jit
def _inv_unit_lower(a, PREC: tl.constexpr):
    """(I + a)^-1 for a strictly lower [16, 16] block: a is nilpotent (a^16 = 0), so the inverse is
    sum_k (-a)^k = (I - a)(I + a^2)(I + a^4)(I + a^8): six tiny matrix products instead of 15 dependent row steps."""
    r = tl.arange(0, 16)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    a2 = tl.dot(a, a, input_precision=PREC)
    a4 = tl.dot(a2, a2, input_precision=PREC)
    a8 = tl.dot(a4, a4, input_precision=PREC)
    x = eye - a
    x += tl.dot(x, a2, input_precision=PREC)
    x += tl.dot(x, a4, input_precision=PREC)
    x += tl.dot(x, a8, input_precision=PREC)
    return x


@triton.jit
def _chunk_rows(info_ptr, c):
    """Chunk c's first row (packed index) and its sequence's valid rows [lo, hi), from the host's table."""
    row = info_ptr + c * 4
    return tl.load(row + 1).to(tl.int64), tl.load(row + 2).to(tl.int64), tl.load(row + 3).to(tl.int64)


@triton.jit
def _tile(ptr, tok0, lo, hi, h, H, W: tl.constexpr, I, cols):
    """Rows of 16-row block I of a [T, H, W] tensor over columns cols, in fp32 (0 outside the sequence)."""
    tok = tok0 + I * 16 + tl.arange(0, 16)
    ok = ((tok >= lo) & (tok < hi))[:, None]
    return tl.load(ptr + (tok[:, None] * H + h) * W + cols[None, :], mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _beta_rows(b_ptr, tok0, lo, hi, h, H, I):
    """beta of 16-row block I as a [16, 1] column (0 outside the sequence)."""
    tok = tok0 + I * 16 + tl.arange(0, 16)
    return tl.load(b_ptr + tok * H + h, mask=(tok >= lo) & (tok < hi), other=0.0).to(tl.float32)[:, None]


@triton.jit
def _blk(ptr, cb, I, J, W: tl.constexpr):
    """Offsets of block (I, J) of the [64, W] matrix of chunk-head cb (W = 64, or 16 for the diagonal scratch)."""
    r16 = tl.arange(0, 16)
    return ptr + (cb + I * 16 + r16[:, None]) * W + J * 16 + r16[None, :]


@triton.jit
def _store_blk(ptr, cb, I, J, x):
    tl.store(_blk(ptr, cb, I, J, 64), x.to(ptr.dtype.element_ty))


@triton.jit
def _zero_upper(ptr, cb):
    """Zeros in the six 16 x 16 blocks above the diagonal blocks of a [64, 64] matrix (they are read whole)."""
    z = tl.zeros([16, 16], tl.float32)
    _store_blk(ptr, cb, 0, 1, z)
    _store_blk(ptr, cb, 0, 2, z)
    _store_blk(ptr, cb, 0, 3, z)
    _store_blk(ptr, cb, 1, 2, z)
    _store_blk(ptr, cb, 1, 3, z)
    _store_blk(ptr, cb, 2, 3, z)


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _diag_block(q_ptr, k_ptr, g_ptr, b_ptr, aqk_ptr, dinv_ptr, c, blk, h, t0, lo, hi, H, scale, K: tl.constexpr,
                PREC: tl.constexpr, IPREC: tl.constexpr):
    """Diagonal block blk over all of K: its A_qk block (scaled, causal) into aqk, and (I + beta A_kk)^-1 of the
    block (fp32) into the [64, 16] diagonal scratch.

    Only gate differences inside the block matter, so the cumulative gates start at the block; both factors take
    the block's middle row m as reference (exponents <= 8 |g|, clamped at 80), so a block of safe gates summing to
    -80 stays finite."""
    cols = tl.arange(0, K)
    r16 = tl.arange(0, 16)
    gc = tl.cumsum(_tile(g_ptr, t0, lo, hi, h, H, K, blk, cols), 0)
    q = _tile(q_ptr, t0, lo, hi, h, H, K, blk, cols)
    k = _tile(k_ptr, t0, lo, hi, h, H, K, blk, cols)
    m = tl.sum(tl.where(r16[:, None] == 7, gc, 0.0), 0)[None, :]
    left = tl.exp(tl.minimum(gc - m, 80.0))
    right = tl.trans(k * tl.exp(tl.minimum(m - gc, 80.0)))
    aqk = _dot(q * left, right, PREC)
    akk = _dot(k * left, right, PREC)
    cb = (c * H + h) * 64
    _store_blk(aqk_ptr, cb, blk, blk, tl.where(r16[None, :] <= r16[:, None], aqk * scale, 0.0))
    beta = _beta_rows(b_ptr, t0, lo, hi, h, H, blk)
    inv = _inv_unit_lower(tl.where(r16[None, :] < r16[:, None], akk * beta, 0.0), IPREC)
    tl.store(_blk(dinv_ptr, cb, blk, 0, 16), inv)


@triton.jit
def _gate_cols(q_ptr, k_ptr, g_ptr, b_ptr, qg_ptr, kg_ptr, kb_ptr, gl_ptr, c, h, t0, lo, hi, H, scale, cols,
               K: tl.constexpr):
    """The chunk's gated rows over columns cols, from its cumulative gates gc and gate sum gl: q exp(gc) (scaled)
    and k exp(gl - gc) for the recurrence and the output, beta k exp(gc) for w; and gl."""
    r64 = tl.arange(0, 64)
    tok = t0 + r64
    ok1 = (tok >= lo) & (tok < hi)
    ok = ok1[:, None]
    idx = (tok[:, None] * H + h) * K + cols[None, :]
    g = tl.load(g_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, 0)
    gl = tl.sum(g, 0)
    tl.store(gl_ptr + (c * H + h) * K + cols, gl)
    q = tl.load(q_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + tok * H + h, mask=ok1, other=0.0).to(tl.float32)[:, None]
    out = ((c * H + h) * 64 + r64[:, None]) * K + cols[None, :]
    e = tl.exp(gc)
    tl.store(qg_ptr + out, (q * scale * e).to(qg_ptr.dtype.element_ty))
    tl.store(kg_ptr + out, (k * tl.exp(gl[None, :] - gc)).to(kg_ptr.dtype.element_ty))
    tl.store(kb_ptr + out, (beta * k * e).to(kb_ptr.dtype.element_ty))


@triton.jit
def _diag_kernel(q_ptr, k_ptr, g_ptr, b_ptr, info_ptr, aqk_ptr, dinv_ptr, qg_ptr, kg_ptr, kb_ptr, gl_ptr, H, scale,
                 K: tl.constexpr, GK: tl.constexpr, PREC: tl.constexpr, IPREC: tl.constexpr):
    """One launch, two kinds of program per (chunk, head): four diagonal blocks (_diag_block), and K / GK gate
    programs of GK columns each (_gate_cols). Both read the same rows; the memory-bound gate programs run beside
    the compute-bound block programs."""
    c = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    if blk < 4:
        _diag_block(q_ptr, k_ptr, g_ptr, b_ptr, aqk_ptr, dinv_ptr, c, blk, h, t0, lo, hi, H, scale, K, PREC, IPREC)
    else:
        _gate_cols(q_ptr, k_ptr, g_ptr, b_ptr, qg_ptr, kg_ptr, kb_ptr, gl_ptr, c, h, t0, lo, hi, H, scale,
                   (blk - 4) * GK + tl.arange(0, GK), K)


@triton.jit
def _qk_block(q, k, left, right, aq, ak, PREC: tl.constexpr):
    """One off-diagonal block's A_qk and A_kk accumulators, plus this K piece: (q | k) * left against right."""
    return (tl.dot(q * left, right, aq, input_precision=PREC), tl.dot(k * left, right, ak, input_precision=PREC))


@triton.jit
def _offdiag_kernel(q_ptr, k_ptr, g_ptr, b_ptr, info_ptr, aqk_ptr, dinv_ptr, ainv_ptr, H, scale, K: tl.constexpr,
                    BK: tl.constexpr, PREC: tl.constexpr, IPREC: tl.constexpr):
    """One (chunk, head): the six off-diagonal 16 x 16 blocks of A_qk and of A_kk, accumulated over BK-column
    pieces of K, then all of (I + A_kk)^-1 from the diagonal blocks' inverses (_diag_block's) by block
    substitution.

    With l the cumulative gates inside each block and s a block's gate sum, block (I, J < I) is
    q_I exp(l_I) . k_J exp(s_J - l_J) times exp(s_{J+1} + ... + s_{I-1}): every exponent is <= 0, so nothing
    overflows whatever the gates."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    z = tl.zeros([16, 16], tl.float32)
    q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z
    k10, k20, k21, k30, k31, k32 = z, z, z, z, z, z
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        g0 = _tile(g_ptr, t0, lo, hi, h, H, K, 0, cols)
        g1 = _tile(g_ptr, t0, lo, hi, h, H, K, 1, cols)
        g2 = _tile(g_ptr, t0, lo, hi, h, H, K, 2, cols)
        g3 = _tile(g_ptr, t0, lo, hi, h, H, K, 3, cols)
        l0, l1, l2, l3 = tl.cumsum(g0, 0), tl.cumsum(g1, 0), tl.cumsum(g2, 0), tl.cumsum(g3, 0)
        s0, s1, s2 = tl.sum(g0, 0)[None, :], tl.sum(g1, 0)[None, :], tl.sum(g2, 0)[None, :]
        # right factors k_j exp(s_J - l_j), transposed
        ra = tl.trans(_tile(k_ptr, t0, lo, hi, h, H, K, 0, cols) * tl.exp(s0 - l0))
        rb = tl.trans(_tile(k_ptr, t0, lo, hi, h, H, K, 1, cols) * tl.exp(s1 - l1))
        rc = tl.trans(_tile(k_ptr, t0, lo, hi, h, H, K, 2, cols) * tl.exp(s2 - l2))
        # left factors exp(l_i), and times the whole blocks between
        e1, e2, e3 = tl.exp(l1), tl.exp(l2), tl.exp(l3)
        e2b, e3c = e2 * tl.exp(s1), e3 * tl.exp(s2)
        e3b = e3c * tl.exp(s1)
        q1 = _tile(q_ptr, t0, lo, hi, h, H, K, 1, cols)
        k1 = _tile(k_ptr, t0, lo, hi, h, H, K, 1, cols)
        q10, k10 = _qk_block(q1, k1, e1, ra, q10, k10, PREC)
        q2 = _tile(q_ptr, t0, lo, hi, h, H, K, 2, cols)
        k2 = _tile(k_ptr, t0, lo, hi, h, H, K, 2, cols)
        q21, k21 = _qk_block(q2, k2, e2, rb, q21, k21, PREC)
        q20, k20 = _qk_block(q2, k2, e2b, ra, q20, k20, PREC)
        q3 = _tile(q_ptr, t0, lo, hi, h, H, K, 3, cols)
        k3 = _tile(k_ptr, t0, lo, hi, h, H, K, 3, cols)
        q32, k32 = _qk_block(q3, k3, e3, rc, q32, k32, PREC)
        q31, k31 = _qk_block(q3, k3, e3c, rb, q31, k31, PREC)
        q30, k30 = _qk_block(q3, k3, e3b, ra, q30, k30, PREC)
    cb = (c * H + h) * 64
    _store_blk(aqk_ptr, cb, 1, 0, q10 * scale)
    _store_blk(aqk_ptr, cb, 2, 0, q20 * scale)
    _store_blk(aqk_ptr, cb, 2, 1, q21 * scale)
    _store_blk(aqk_ptr, cb, 3, 0, q30 * scale)
    _store_blk(aqk_ptr, cb, 3, 1, q31 * scale)
    _store_blk(aqk_ptr, cb, 3, 2, q32 * scale)
    _zero_upper(aqk_ptr, cb)
    # A_kk rows times beta_i
    b1 = _beta_rows(b_ptr, t0, lo, hi, h, H, 1)
    b2 = _beta_rows(b_ptr, t0, lo, hi, h, H, 2)
    b3 = _beta_rows(b_ptr, t0, lo, hi, h, H, 3)
    a10, a20, a21 = k10 * b1, k20 * b2, k21 * b2
    a30, a31, a32 = k30 * b3, k31 * b3, k32 * b3
    i0 = tl.load(_blk(dinv_ptr, cb, 0, 0, 16))
    i1 = tl.load(_blk(dinv_ptr, cb, 1, 0, 16))
    i2 = tl.load(_blk(dinv_ptr, cb, 2, 0, 16))
    i3 = tl.load(_blk(dinv_ptr, cb, 3, 0, 16))
    # (I + A)^-1 blocks: X_IJ = -X_II sum_{J <= L < I} A_IL X_LJ
    x10 = -_dot(i1, _dot(a10, i0, IPREC), IPREC)
    x21 = -_dot(i2, _dot(a21, i1, IPREC), IPREC)
    x32 = -_dot(i3, _dot(a32, i2, IPREC), IPREC)
    x20 = -_dot(i2, _dot(a20, i0, IPREC) + _dot(a21, x10, IPREC), IPREC)
    x31 = -_dot(i3, _dot(a31, i1, IPREC) + _dot(a32, x21, IPREC), IPREC)
    x30 = -_dot(i3, _dot(a30, i0, IPREC) + _dot(a31, x10, IPREC) + _dot(a32, x20, IPREC), IPREC)
    _store_blk(ainv_ptr, cb, 0, 0, i0)
    _store_blk(ainv_ptr, cb, 1, 1, i1)
    _store_blk(ainv_ptr, cb, 2, 2, i2)
    _store_blk(ainv_ptr, cb, 3, 3, i3)
    _store_blk(ainv_ptr, cb, 1, 0, x10)
    _store_blk(ainv_ptr, cb, 2, 0, x20)
    _store_blk(ainv_ptr, cb, 2, 1, x21)
    _store_blk(ainv_ptr, cb, 3, 0, x30)
    _store_blk(ainv_ptr, cb, 3, 1, x31)
    _store_blk(ainv_ptr, cb, 3, 2, x32)
    _zero_upper(ainv_ptr, cb)


@triton.jit
def _wy_kernel(kb_ptr, v_ptr, b_ptr, info_ptr, ainv_ptr, w_ptr, u_ptr, H, K: tl.constexpr, V: tl.constexpr,
               BW: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr):
    """w and u0 of one (chunk, head): X = (I + A_kk)^-1 R for R = beta k exp(gc) (w; the intra kernel wrote it)
    and R = beta v (u0), BW columns at a time; the (K + V) / BW column blocks are shared among SPLIT programs,
    each reading the inverse once. R is rounded to the inverse's dtype for the product."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    r64 = tl.arange(0, 64)
    tok = t0 + r64
    ok = (tok >= lo) & (tok < hi)
    cb = (c * H + h) * 64
    a = tl.load(ainv_ptr + (cb + r64[:, None]) * 64 + r64[None, :])
    NB: tl.constexpr = (K + V) // BW
    for jj in range(NB // SPLIT):
        j = p * (NB // SPLIT) + jj
        if j < K // BW:
            out = (cb + r64[:, None]) * K + j * BW + tl.arange(0, BW)[None, :]
            x = tl.dot(a, tl.load(kb_ptr + out).to(a.dtype), input_precision=PREC)
            tl.store(w_ptr + out, x.to(w_ptr.dtype.element_ty))
        else:
            cols = (j - K // BW) * BW + tl.arange(0, BW)
            b = tl.load(b_ptr + tok * H + h, mask=ok, other=0.0).to(tl.float32)[:, None]
            r = b * tl.load(v_ptr + (tok[:, None] * H + h) * V + cols[None, :], mask=ok[:, None], other=0.0)
            x = tl.dot(a, r.to(a.dtype), input_precision=PREC)
            tl.store(u_ptr + (cb + r64[:, None]) * V + cols[None, :], x.to(u_ptr.dtype.element_ty))


@triton.jit
def _chunk_step(S, c, h, w_ptr, u_ptr, kg_ptr, gl_ptr, h_ptr, vn_ptr, states_ptr, rk, rv, sidx, H, K: tl.constexpr,
                V: tl.constexpr, STATES: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the recurrence: store the chunk's starting state, u = u0 - w S, S <- exp(gl) S + kg^T u."""
    r64 = tl.arange(0, 64)
    dt = kg_ptr.dtype.element_ty
    cb = (c * H + h) * 64
    tl.store(h_ptr + (c * H + h) * K * V + sidx, S.to(h_ptr.dtype.element_ty))
    wc = tl.load(w_ptr + (cb + r64[:, None]) * K + rk[None, :])
    u = tl.load(u_ptr + (cb + r64[:, None]) * V + rv[None, :]).to(tl.float32)
    kg = tl.load(kg_ptr + (cb + r64[:, None]) * K + rk[None, :])
    gl = tl.load(gl_ptr + (c * H + h) * K + rk)
    u -= tl.dot(wc, S.to(dt), input_precision=PREC)
    tl.store(vn_ptr + (cb + r64[:, None]) * V + rv[None, :], u.to(vn_ptr.dtype.element_ty))
    S = S * tl.exp(gl)[:, None] + tl.dot(tl.trans(kg), u.to(dt), input_precision=PREC)
    if STATES:
        tl.store(states_ptr + (c * H + h) * K * V + sidx, S)
    return S


@triton.jit
def _recurrence_kernel(w_ptr, u_ptr, kg_ptr, gl_ptr, h0_ptr, cs_ptr, order_ptr, h_ptr, vn_ptr, final_ptr,
                       states_ptr, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                       STATES: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr, LONGEST_FIRST: tl.constexpr):
    # grid (heads, value blocks, sequences): programs start in that order, so the slowest axis picks the sequence,
    # the longest first when LONGEST_FIRST
    h = tl.program_id(0).to(tl.int64)
    vb = tl.program_id(1)
    if LONGEST_FIRST:
        i = tl.load(order_ptr + tl.program_id(2))
    else:
        i = tl.program_id(2)
    n = i.to(tl.int64)
    c0 = tl.load(cs_ptr + i)
    c1 = tl.load(cs_ptr + i + 1)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    sidx = rk[:, None] * V + rv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + (n * H + h) * K * V + sidx).to(tl.float32)
    else:
        S = tl.zeros([K, BV], tl.float32)
    if WHILE:  # the interpreter cannot turn a loaded scalar into a range bound
        c = c0.to(tl.int64)
        while c < c1:
            S = _chunk_step(S, c, h, w_ptr, u_ptr, kg_ptr, gl_ptr, h_ptr, vn_ptr, states_ptr, rk, rv, sidx, H, K, V,
                            STATES, PREC)
            c += 1
    else:  # a counted loop, which the compiler software-pipelines: the next chunk's loads overlap this one's dots
        for c in range(c0, c1):
            S = _chunk_step(S, c.to(tl.int64), h, w_ptr, u_ptr, kg_ptr, gl_ptr, h_ptr, vn_ptr, states_ptr, rk, rv,
                            sidx, H, K, V, STATES, PREC)
    tl.store(final_ptr + (n * H + h) * K * V + sidx, S)


@triton.jit
def _output_kernel(qg_ptr, h_ptr, aqk_ptr, vn_ptr, info_ptr, o_ptr, H,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    r64 = tl.arange(0, 64)
    cb = (c * H + h) * 64
    qg = tl.load(qg_ptr + (cb + r64[:, None]) * K + rk[None, :])
    hs = tl.load(h_ptr + (c * H + h) * K * V + rk[:, None] * V + rv[None, :])
    a = tl.load(aqk_ptr + (cb + r64[:, None]) * 64 + r64[None, :])
    vn = tl.load(vn_ptr + (cb + r64[:, None]) * V + rv[None, :])
    o = tl.dot(qg, hs, input_precision=PREC) + tl.dot(a, vn, input_precision=PREC)
    tok = t0 + r64
    ok = (tok >= lo) & (tok < hi)
    tl.store(o_ptr + (tok[:, None] * H + h) * V + rv[None, :], o.to(o_ptr.dtype.element_ty), mask=ok[:, None])


def _carve(shapes, dtype, device):
    """Uninitialised tensors of the given shapes, as consecutive views of one allocation."""
    sizes = [math.prod(shape) for shape in shapes]
    buf = torch.empty(sum(sizes), dtype=dtype, device=device)
    return [x.view(shape) for x, shape in zip(buf.split(sizes), shapes)]


# Device copies of recent chunk tables, keyed by the sequences' boundaries and start positions: a repeated batch
# layout (each layer of one forward, a benchmark loop) skips the host-to-device copy, as fla caches its chunk indices
# per cu_seqlens tensor.
_TABLES: collections.OrderedDict = collections.OrderedDict()
_TABLES_MAX = 64


def _device_table(cu: list[int], starts: list[int], C: int, dev: torch.device):
    """(the chunk table on dev, per-sequence chunk offsets) for chunk_table(cu, starts, C), cached."""
    # the stream too: a table copied on one stream is not ordered before kernels on another
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None
    key = (tuple(cu), tuple(starts), C, dev, stream)
    hit = _TABLES.get(key)
    if hit is not None:
        _TABLES.move_to_end(key)
        return hit
    tab, offsets = chunk_table(cu, starts, C)
    tab = torch.from_numpy(tab)
    # one host-to-device copy, from pinned memory so it does not wait for the queue to drain
    tab = tab.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else tab.to(dev)
    _TABLES[key] = tab, offsets
    if len(_TABLES) > _TABLES_MAX:
        _TABLES.popitem(last=False)
    return tab, offsets


def kda_chunked(q, k, v, g, beta, cu_seqlens=None, scale: float | None = None, initial_state=None,
                start_positions=None, chunk_size: int = 64, output_chunk_states: bool = False):
    """See reference.kda_chunked (same signature and results). fp64 or chunk_size != 64 go to the reference."""
    T, H, K = k.shape
    V = v.shape[-1]
    if v.dtype == torch.float64 or chunk_size != 64 or K & (K - 1) or V & (V - 1) or K < 16 or V < 16:
        from kestrel.ops.kda.reference import kda_chunked as ref
        return ref(q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale, initial_state=initial_state,
                   start_positions=start_positions, chunk_size=chunk_size, output_chunk_states=output_chunk_states)
    C = chunk_size
    scale = K**-0.5 if scale is None else scale
    cu = [0, T] if cu_seqlens is None else [int(x) for x in cu_seqlens]
    N = len(cu) - 1
    starts = [0] * N if start_positions is None else [int(s) for s in start_positions]
    tab, offsets = _device_table(cu, starts, C, v.device)
    NC = offsets[-1]
    dev, dt = v.device, v.dtype
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    f32 = torch.float32
    prec = "ieee" if dt == f32 else "tf32"
    o = torch.empty(T, H, V, dtype=dt, device=dev)
    final = torch.empty(N, H, K, V, dtype=f32, device=dev)
    states = torch.empty(max(NC, 1), H, K, V, dtype=f32, device=dev) if output_chunk_states else final
    if NC:
        info_t, cs_t, order_t = tab[: 4 * NC], tab[4 * NC : 4 * NC + N + 1], tab[4 * NC + N + 1 :]
        # u0 in the activations' dtype, like w: the recurrence subtracts w S from it in fp32; (I + A_kk)^-1 in fp32,
        # or in bf16 / fp16 (as the products that read it) when TILES says so
        low = dt != f32 and TILES["ainv_low"]
        act = [(NC, H, C, C), (NC, H, C, K), (NC, H, C, V), (NC, H, C, K), (NC, H, C, K), (NC, H, C, K),
               (NC, H, K, V), (NC, H, C, V)]
        wide = [(NC, H, C, 16), (NC, H, K)]
        (act if low else wide).append((NC, H, C, C))
        ws, fs = _carve(act, dt, dev), _carve(wide, f32, dev)
        aqk, w, u0, qg, kg, kb, hs, vn = ws[:8]
        dinv, gl = fs[:2]
        ainv = ws[8] if low else fs[2]
        iprec = "tf32" if dt != f32 and TILES["inverse_tf32"] else "ieee"
        GK = min(K, TILES["gate_cols"])
        launch(_diag_kernel, (NC, 4 + K // GK, H), q, k, g, beta, info_t, aqk, dinv, qg, kg, kb, gl, H,
               float(scale), K=K, GK=GK, PREC=prec, IPREC=iprec, num_warps=TILES["diag_warps"])
        launch(_offdiag_kernel, (NC, H), q, k, g, beta, info_t, aqk, dinv, ainv, H, float(scale), K=K,
               BK=min(K, TILES["intra_bk"]), PREC=prec, IPREC=iprec, num_warps=TILES["intra_warps"])
        BW = min(K, V, TILES["wy_cols"])
        split = math.gcd(TILES["wy_split"], (K + V) // BW)
        launch(_wy_kernel, (NC, H, split), kb, v, beta, info_t, ainv, w, u0, H, K=K, V=V, BW=BW, SPLIT=split,
               PREC=prec, num_warps=TILES["wy_warps"], num_stages=TILES["wy_stages"])
        BV = min(V, TILES["rec_bv_small"] if N * H < 128 else TILES["rec_bv"])
        h0 = initial_state.to(f32).contiguous() if initial_state is not None else final
        launch(_recurrence_kernel, (H, V // BV, N), w, u0, kg, gl, h0, cs_t, order_t, hs, vn, final, states, H, K=K,
               V=V, BV=BV, HAS_H0=initial_state is not None, STATES=output_chunk_states, PREC=prec,
               WHILE=triton_interpreted(), LONGEST_FIRST=TILES["rec_longest_first"], num_warps=TILES["rec_warps"],
               num_stages=TILES["rec_stages"])
        BVo = min(V, 64)
        launch(_output_kernel, (NC, H, V // BVo), qg, hs, aqk, vn, info_t, o, H, K=K, V=V, BV=BVo, PREC=prec,
               num_warps=4)
    else:
        final.copy_(initial_state.to(f32) if initial_state is not None else torch.zeros_like(final))
    if not output_chunk_states:
        return o, final
    per_seq = []
    for i in range(N):
        front = starts[i] % C
        L = cu[i + 1] - cu[i]
        n_i = offsets[i + 1] - offsets[i]
        base = starts[i] - front
        pos = [min(base + (j + 1) * C, starts[i] + L) for j in range(n_i)]
        per_seq.append((pos, states[offsets[i] : offsets[i + 1]]))
    return o, final, per_seq
