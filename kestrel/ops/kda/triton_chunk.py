"""Triton chunked KDA prefill (WY form over 64-token chunks aligned to absolute positions), in four launches:

1. intra (parallel over chunks x heads): A_qk and A_kk in 16 x 16 blocks, accumulated over pieces of K, then
   (I + A_kk)^-1 from the diagonal blocks' inverses (product form) by block substitution. Off-diagonal blocks take
   the gate sum before the row block as their reference, so every exponent there is <= 0; diagonal blocks take
   their middle row (exponents <= 8 |g|), so a chunk of safe gates summing to -320 never overflows.
2. w and u0 (parallel over chunks x heads x column blocks): X = (I + A_kk)^-1 [beta k exp(gc) | beta v] as one
   product; the w programs also write q exp(gc), k exp(gc_last - gc) and gc_last.
3. recurrence (sequential over a sequence's chunks, parallel over heads x value blocks): u = u0 - w S;
   S <- exp(gc_last) S + (k exp(gc_last - gc))^T u. Writes each chunk's starting state h and u.
4. output (parallel): o = (scale q exp(gc)) h + A_qk u.

Exact for per-token gates >= -10 (twice the safe-gate bound): beyond that the diagonal blocks' factors are clamped
at e^80 and accuracy degrades gracefully instead of overflowing.
"""

import math

import torch
import triton
import triton.language as tl

from kestrel.ops import triton_interpreted
from kestrel.ops.kda.layout import chunk_table

# Launch shapes and one precision choice (benchmarks/kernels.py --chunk-sweep tries others): the intra kernel's
# warps and K piece, and whether its 16 x 16 inverse products run in tf32 for bf16 inputs (else fp32); columns and
# warps of the w / u0 kernel; the recurrence's value-block width (below 128 sequence-heads the narrower one, for
# more programs) and its pipeline depth.
TILES = {"intra_warps": 4, "intra_bk": 16, "inverse_tf32": True, "wy_cols": 64, "wy_warps": 4, "rec_bv": 64,
         "rec_bv_small": 32, "rec_stages": 2}


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
def _block(q_ptr, k_ptr, g_ptr, tok0, lo, hi, h, H, K: tl.constexpr, I: tl.constexpr, cols, carry):
    """Rows of 16-row block I over columns cols: q, k, cumulative gates (carry = the gate sum before the block),
    and the gate sum after the block."""
    tok = tok0 + I * 16 + tl.arange(0, 16)
    ok = ((tok >= lo) & (tok < hi))[:, None]
    idx = (tok[:, None] * H + h) * K + cols[None, :]
    g = tl.load(g_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, 0) + carry[None, :]
    q = tl.load(q_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    return q, k, gc, carry + tl.sum(g, 0)


@triton.jit
def _beta_rows(b_ptr, tok0, lo, hi, h, H, I: tl.constexpr):
    """beta of 16-row block I as a [16, 1] column (0 outside the sequence)."""
    tok = tok0 + I * 16 + tl.arange(0, 16)
    return tl.load(b_ptr + tok * H + h, mask=(tok >= lo) & (tok < hi), other=0.0).to(tl.float32)[:, None]


@triton.jit
def _diag(q, k, gc, aqk, akk, PREC: tl.constexpr):
    """A diagonal block's products around the block's middle cumulative gate m (exponents <= 8 |g|, clamped)."""
    m = tl.sum(tl.where(tl.arange(0, 16)[:, None] == 7, gc, 0.0), 0)[None, :]
    left = tl.exp(tl.minimum(gc - m, 80.0))
    right = tl.trans(k * tl.exp(tl.minimum(m - gc, 80.0)))
    aqk += tl.dot(q * left, right, input_precision=PREC)
    akk += tl.dot(k * left, right, input_precision=PREC)
    return aqk, akk


@triton.jit
def _store_blk(ptr, cb, I: tl.constexpr, J: tl.constexpr, x):
    r16 = tl.arange(0, 16)
    tl.store(ptr + (cb + I * 16 + r16[:, None]) * 64 + J * 16 + r16[None, :], x.to(ptr.dtype.element_ty))


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
def _intra_kernel(q_ptr, k_ptr, g_ptr, b_ptr, info_ptr, aqk_ptr, ainv_ptr, H, scale, K: tl.constexpr,
                  BK: tl.constexpr, PREC: tl.constexpr, IPREC: tl.constexpr):
    """One (chunk, head): A_qk and A_kk in 16x16 blocks, accumulated over BK-column pieces of K, then
    (I + A_kk)^-1 assembled from the diagonal blocks' inverses.

    Off-diagonal block (I, J < I) uses the gate sum before block I, c_I, as its reference: q_i exp(gc_i - c_I)
    and k_j exp(c_{J+1} - gc_j) exp(c_I - c_{J+1}) all have exponents <= 0, so they cannot overflow; diagonal
    blocks use their middle row (see _diag)."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    r16 = tl.arange(0, 16)
    z = tl.zeros([16, 16], tl.float32)
    q00, q11, q22, q33, q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z, z, z, z, z
    k00, k11, k22, k33, k10, k20, k21, k30, k31, k32 = z, z, z, z, z, z, z, z, z, z
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        c0 = tl.zeros([BK], tl.float32)
        qa, ka, ga, c1 = _block(q_ptr, k_ptr, g_ptr, t0, lo, hi, h, H, K, 0, cols, c0)
        qb, kb_, gb, c2 = _block(q_ptr, k_ptr, g_ptr, t0, lo, hi, h, H, K, 1, cols, c1)
        qc, kc, gcc, c3 = _block(q_ptr, k_ptr, g_ptr, t0, lo, hi, h, H, K, 2, cols, c2)
        qd, kd, gd, _ = _block(q_ptr, k_ptr, g_ptr, t0, lo, hi, h, H, K, 3, cols, c3)
        q00, k00 = _diag(qa, ka, ga, q00, k00, PREC)
        q11, k11 = _diag(qb, kb_, gb, q11, k11, PREC)
        q22, k22 = _diag(qc, kc, gcc, q22, k22, PREC)
        q33, k33 = _diag(qd, kd, gd, q33, k33, PREC)
        # right factors k_j exp(c_{J+1} - gc_j), transposed; left factors exp(gc_i - c_I)
        ra = tl.trans(ka * tl.exp(c1[None, :] - ga))
        rb = tl.trans(kb_ * tl.exp(c2[None, :] - gb))
        rc = tl.trans(kc * tl.exp(c3[None, :] - gcc))
        lb = tl.exp(gb - c1[None, :])
        lc = tl.exp(gcc - c2[None, :])
        ld = tl.exp(gd - c3[None, :])
        q10 += tl.dot(qb * lb, ra, input_precision=PREC)
        k10 += tl.dot(kb_ * lb, ra, input_precision=PREC)
        q21 += tl.dot(qc * lc, rb, input_precision=PREC)
        k21 += tl.dot(kc * lc, rb, input_precision=PREC)
        q32 += tl.dot(qd * ld, rc, input_precision=PREC)
        k32 += tl.dot(kd * ld, rc, input_precision=PREC)
        lc2 = lc * tl.exp(c2 - c1)[None, :]  # block 2 against block 0: the gates of block 1 between them
        q20 += tl.dot(qc * lc2, ra, input_precision=PREC)
        k20 += tl.dot(kc * lc2, ra, input_precision=PREC)
        ld3 = ld * tl.exp(c3 - c2)[None, :]
        q31 += tl.dot(qd * ld3, rb, input_precision=PREC)
        k31 += tl.dot(kd * ld3, rb, input_precision=PREC)
        ld30 = ld3 * tl.exp(c2 - c1)[None, :]
        q30 += tl.dot(qd * ld30, ra, input_precision=PREC)
        k30 += tl.dot(kd * ld30, ra, input_precision=PREC)
    cb = (c * H + h) * 64
    # A_qk: scaled, causal (diagonal blocks keep j <= i), zero above the diagonal blocks
    keep = r16[None, :] <= r16[:, None]
    _store_blk(aqk_ptr, cb, 0, 0, tl.where(keep, q00 * scale, 0.0))
    _store_blk(aqk_ptr, cb, 1, 1, tl.where(keep, q11 * scale, 0.0))
    _store_blk(aqk_ptr, cb, 2, 2, tl.where(keep, q22 * scale, 0.0))
    _store_blk(aqk_ptr, cb, 3, 3, tl.where(keep, q33 * scale, 0.0))
    _store_blk(aqk_ptr, cb, 1, 0, q10 * scale)
    _store_blk(aqk_ptr, cb, 2, 0, q20 * scale)
    _store_blk(aqk_ptr, cb, 2, 1, q21 * scale)
    _store_blk(aqk_ptr, cb, 3, 0, q30 * scale)
    _store_blk(aqk_ptr, cb, 3, 1, q31 * scale)
    _store_blk(aqk_ptr, cb, 3, 2, q32 * scale)
    _zero_upper(aqk_ptr, cb)
    # A_kk rows times beta_i; strictly lower inside the diagonal blocks
    strict = r16[None, :] < r16[:, None]
    b0 = _beta_rows(b_ptr, t0, lo, hi, h, H, 0)
    b1 = _beta_rows(b_ptr, t0, lo, hi, h, H, 1)
    b2 = _beta_rows(b_ptr, t0, lo, hi, h, H, 2)
    b3 = _beta_rows(b_ptr, t0, lo, hi, h, H, 3)
    i0 = _inv_unit_lower(tl.where(strict, k00 * b0, 0.0), IPREC)
    i1 = _inv_unit_lower(tl.where(strict, k11 * b1, 0.0), IPREC)
    i2 = _inv_unit_lower(tl.where(strict, k22 * b2, 0.0), IPREC)
    i3 = _inv_unit_lower(tl.where(strict, k33 * b3, 0.0), IPREC)
    a10, a20, a21 = k10 * b1, k20 * b2, k21 * b2
    a30, a31, a32 = k30 * b3, k31 * b3, k32 * b3
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
def _wy_cols(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, ainv_ptr, x_ptr, qg_ptr, kg_ptr, gl_ptr, c, h, t0, lo, hi, H, scale,
             cols, K: tl.constexpr, W: tl.constexpr, IS_W: tl.constexpr, PREC: tl.constexpr):
    """X = (I + A_kk)^-1 R over columns cols: w (IS_W, R = beta k exp(gc)) or u0 (R = beta v). For w also the
    chunk's q exp(gc) (scaled), k exp(gc_last - gc) and gc_last over those columns."""
    r64 = tl.arange(0, 64)
    tok = t0 + r64
    ok = (tok >= lo) & (tok < hi)
    cb = (c * H + h) * 64
    b = tl.load(b_ptr + tok * H + h, mask=ok, other=0.0).to(tl.float32)[:, None]
    idx = (tok[:, None] * H + h) * W + cols[None, :]
    if IS_W:
        g = tl.load(g_ptr + idx, mask=ok[:, None], other=0.0).to(tl.float32)
        gc = tl.cumsum(g, 0)
        gl = tl.sum(g, 0)
        k = tl.load(k_ptr + idx, mask=ok[:, None], other=0.0).to(tl.float32)
        q = tl.load(q_ptr + idx, mask=ok[:, None], other=0.0).to(tl.float32)
        out = (cb + r64[:, None]) * K + cols[None, :]
        tl.store(qg_ptr + out, (q * scale * tl.exp(gc)).to(qg_ptr.dtype.element_ty))
        tl.store(kg_ptr + out, (k * tl.exp(gl[None, :] - gc)).to(kg_ptr.dtype.element_ty))
        tl.store(gl_ptr + (c * H + h) * K + cols, gl)
        r = b * k * tl.exp(gc)
    else:
        r = b * tl.load(v_ptr + idx, mask=ok[:, None], other=0.0).to(tl.float32)
    a = tl.load(ainv_ptr + (cb + r64[:, None]) * 64 + r64[None, :])
    x = tl.dot(a, r, input_precision=PREC)
    tl.store(x_ptr + (cb + r64[:, None]) * W + cols[None, :], x.to(x_ptr.dtype.element_ty))


@triton.jit
def _wy_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, info_ptr, ainv_ptr, w_ptr, u_ptr, qg_ptr, kg_ptr, gl_ptr, H, scale,
               K: tl.constexpr, V: tl.constexpr, BW: tl.constexpr, PREC: tl.constexpr):
    """w and u0 of one (chunk, head), BW columns a program: the first K / BW programs make w, the rest u0."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.program_id(2)
    t0, lo, hi = _chunk_rows(info_ptr, c)
    if p < K // BW:
        _wy_cols(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, ainv_ptr, w_ptr, qg_ptr, kg_ptr, gl_ptr, c, h, t0, lo, hi, H,
                 scale, p * BW + tl.arange(0, BW), K, K, True, PREC)
    else:
        _wy_cols(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, ainv_ptr, u_ptr, qg_ptr, kg_ptr, gl_ptr, c, h, t0, lo, hi, H,
                 scale, (p - K // BW) * BW + tl.arange(0, BW), K, V, False, PREC)


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
def _recurrence_kernel(w_ptr, u_ptr, kg_ptr, gl_ptr, h0_ptr, cs_ptr, h_ptr, vn_ptr, final_ptr, states_ptr, H,
                       K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                       STATES: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2)
    c0 = tl.load(cs_ptr + tl.program_id(0))
    c1 = tl.load(cs_ptr + tl.program_id(0) + 1)
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
    tab, offsets = chunk_table(cu, starts, C)
    NC = offsets[-1]
    dev, dt = v.device, v.dtype
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    f32 = torch.float32
    prec = "ieee" if dt == f32 else "tf32"
    o = torch.empty(T, H, V, dtype=dt, device=dev)
    final = torch.empty(N, H, K, V, dtype=f32, device=dev)
    states = torch.empty(max(NC, 1), H, K, V, dtype=f32, device=dev) if output_chunk_states else final
    if NC:
        # one host-to-device copy of the tables, from pinned memory so it does not wait for the queue to drain
        tab = torch.from_numpy(tab)
        tab = tab.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else tab.to(dev)
        info_t, cs_t = tab[: 4 * NC], tab[4 * NC :]
        # u0 in the activations' dtype, like w: the recurrence subtracts w S from it in fp32
        aqk, w, u0, qg, kg, hs, vn = _carve([(NC, H, C, C), (NC, H, C, K), (NC, H, C, V), (NC, H, C, K), (NC, H, C, K),
                                             (NC, H, K, V), (NC, H, C, V)], dt, dev)
        ainv, gl = _carve([(NC, H, C, C), (NC, H, K)], f32, dev)
        _intra_kernel[(NC, H)](q, k, g, beta, info_t, aqk, ainv, H, float(scale), K=K, BK=min(K, TILES["intra_bk"]),
                               PREC=prec, IPREC="tf32" if dt != f32 and TILES["inverse_tf32"] else "ieee",
                               num_warps=TILES["intra_warps"])
        BW = min(K, V, TILES["wy_cols"])
        _wy_kernel[(NC, H, (K + V) // BW)](q, k, v, g, beta, info_t, ainv, w, u0, qg, kg, gl, H, float(scale), K=K,
                                           V=V, BW=BW, PREC=prec, num_warps=TILES["wy_warps"])
        BV = min(V, TILES["rec_bv_small"] if N * H < 128 else TILES["rec_bv"])
        h0 = initial_state.to(f32).contiguous() if initial_state is not None else final
        _recurrence_kernel[(N, H, V // BV)](w, u0, kg, gl, h0, cs_t, hs, vn, final, states, H, K=K, V=V, BV=BV,
                                            HAS_H0=initial_state is not None, STATES=output_chunk_states,
                                            PREC=prec, WHILE=triton_interpreted(), num_warps=4,
                                            num_stages=TILES["rec_stages"])
        BVo = min(V, 64)
        _output_kernel[(NC, H, V // BVo)](qg, hs, aqk, vn, info_t, o, H, K=K, V=V, BV=BVo, PREC=prec, num_warps=4)
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
