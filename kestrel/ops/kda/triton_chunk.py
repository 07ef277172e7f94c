"""Triton chunked KDA prefill (WY form over 64-token chunks aligned to absolute positions), three launches:

1. intra (parallel over chunks x heads): cumulative gates; the chunk's A_kk and A_qk built 16 rows at a time
   around each row block's middle cumulative gate m (right factor k_j exp(m - gc_j) has exponent <= 0 for earlier
   rows and <= 8 |g| inside the block, left factor q_i exp(gc_i - m) likewise), so a chunk of safe gates summing to
   -320 never overflows; then (I + A_kk) X = [beta k exp(gc) | beta v] by block forward substitution, giving w, u0.
2. recurrence (sequential over a sequence's chunks, parallel over heads x value blocks): u = u0 - w S;
   S <- exp(gc_last) S + (k exp(gc_last - gc))^T u. Writes each chunk's starting state h and u.
3. output (parallel): o = (scale q exp(gc)) h + A_qk u.

Exact for per-token gates >= -10 (twice the safe-gate bound): beyond that the in-block factors are clamped at
e^80 and accuracy degrades gracefully instead of overflowing.
"""

import torch
import triton
import triton.language as tl

BT = 16  # row block of the intra-chunk factorisation


@triton.jit
def _inv_unit_lower(a):
    """(I + a)^-1 for a strictly lower [16, 16] block: a is nilpotent (a^16 = 0), so the inverse is
    sum_k (-a)^k = (I - a)(I + a^2)(I + a^4)(I + a^8): six tiny matrix products instead of 15 dependent row steps."""
    r = tl.arange(0, 16)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    a2 = tl.dot(a, a, input_precision="ieee")
    a4 = tl.dot(a2, a2, input_precision="ieee")
    a8 = tl.dot(a4, a4, input_precision="ieee")
    x = eye - a
    x += tl.dot(x, a2, input_precision="ieee")
    x += tl.dot(x, a4, input_precision="ieee")
    x += tl.dot(x, a8, input_precision="ieee")
    return x


@triton.jit
def _intra_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, info_ptr, gc_ptr, akk_ptr, aqk_ptr, w_ptr, u_ptr, qg_ptr, kg_ptr,
                  gl_ptr, H, scale, K: tl.constexpr, V: tl.constexpr, PREC: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    t0 = tl.load(info_ptr + c * 4 + 1).to(tl.int64)
    lo = tl.load(info_ptr + c * 4 + 2).to(tl.int64)
    hi = tl.load(info_ptr + c * 4 + 3).to(tl.int64)
    dt = q_ptr.dtype.element_ty
    r64 = tl.arange(0, 64)
    r16 = tl.arange(0, 16)
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    tok = t0 + r64
    ok = (tok >= lo) & (tok < hi)
    # [64, K] gates -> cumulative gates (rows outside the sequence are no-ops: g = 0)
    g = tl.load(g_ptr + (tok[:, None] * H + h) * K + rk[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    gc = tl.cumsum(g, 0)
    cb = (c * H + h) * 64  # row base of this (chunk, head) in the scratch buffers
    tl.store(gc_ptr + (cb + r64[:, None]) * K + rk[None, :], gc)
    gl = tl.sum(tl.where(r64[:, None] == 63, gc, 0.0), 0)
    tl.store(gl_ptr + (c * H + h) * K + rk, gl)
    kf = tl.load(k_ptr + (tok[:, None] * H + h) * K + rk[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    qf = tl.load(q_ptr + (tok[:, None] * H + h) * K + rk[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(qg_ptr + (cb + r64[:, None]) * K + rk[None, :], (qf * scale * tl.exp(gc)).to(dt))
    tl.store(kg_ptr + (cb + r64[:, None]) * K + rk[None, :], (kf * tl.exp(gl[None, :] - gc)).to(dt))
    tl.debug_barrier()
    for I in tl.static_range(4):
        rows = I * 16 + r16
        tokI = t0 + rows
        okI = (tokI >= lo) & (tokI < hi)
        gcI = tl.load(gc_ptr + (cb + rows[:, None]) * K + rk[None, :])
        m = tl.load(gc_ptr + (cb + I * 16 + 7) * K + rk)
        qI = tl.load(q_ptr + (tokI[:, None] * H + h) * K + rk[None, :], mask=okI[:, None], other=0.0).to(tl.float32)
        kI = tl.load(k_ptr + (tokI[:, None] * H + h) * K + rk[None, :], mask=okI[:, None], other=0.0).to(tl.float32)
        left = tl.exp(tl.minimum(gcI - m[None, :], 80.0))
        right = tl.where(r64[:, None] < I * 16 + 16, kf * tl.exp(tl.minimum(m[None, :] - gc, 80.0)), 0.0)
        aqk = tl.dot(qI * left, tl.trans(right), input_precision=PREC) * scale
        akk = tl.dot(kI * left, tl.trans(right), input_precision=PREC)
        bI = tl.load(b_ptr + tokI * H + h, mask=okI, other=0.0).to(tl.float32)
        aqk = tl.where(r64[None, :] <= rows[:, None], aqk, 0.0)
        akk = tl.where(r64[None, :] < rows[:, None], akk * bI[:, None], 0.0)
        tl.store(aqk_ptr + (cb + rows[:, None]) * 64 + r64[None, :], aqk.to(aqk_ptr.dtype.element_ty))
        tl.store(akk_ptr + (cb + rows[:, None]) * 64 + r64[None, :], akk)
    tl.debug_barrier()
    # block forward substitution: X_I = (I + A_II)^-1 (R_I - sum_{J<I} A_IJ X_J), X = [w | u0]
    for I in tl.static_range(4):
        rows = I * 16 + r16
        tokI = t0 + rows
        okI = (tokI >= lo) & (tokI < hi)
        bI = tl.load(b_ptr + tokI * H + h, mask=okI, other=0.0).to(tl.float32)
        kI = tl.load(k_ptr + (tokI[:, None] * H + h) * K + rk[None, :], mask=okI[:, None], other=0.0).to(tl.float32)
        vI = tl.load(v_ptr + (tokI[:, None] * H + h) * V + rv[None, :], mask=okI[:, None], other=0.0).to(tl.float32)
        gcI = tl.load(gc_ptr + (cb + rows[:, None]) * K + rk[None, :])
        rw = bI[:, None] * kI * tl.exp(gcI)
        ru = bI[:, None] * vI
        for J in tl.static_range(I):
            colsJ = J * 16 + r16
            aIJ = tl.load(akk_ptr + (cb + rows[:, None]) * 64 + colsJ[None, :])
            wJ = tl.load(w_ptr + (cb + colsJ[:, None]) * K + rk[None, :]).to(tl.float32)
            uJ = tl.load(u_ptr + (cb + colsJ[:, None]) * V + rv[None, :]).to(tl.float32)
            rw -= tl.dot(aIJ, wJ, input_precision=PREC)
            ru -= tl.dot(aIJ, uJ, input_precision=PREC)
        minv = _inv_unit_lower(tl.load(akk_ptr + (cb + rows[:, None]) * 64 + rows[None, :]))
        tl.store(w_ptr + (cb + rows[:, None]) * K + rk[None, :], tl.dot(minv, rw, input_precision=PREC))
        tl.store(u_ptr + (cb + rows[:, None]) * V + rv[None, :], tl.dot(minv, ru, input_precision=PREC))
        tl.debug_barrier()


@triton.jit
def _recurrence_kernel(w_ptr, u_ptr, kg_ptr, gl_ptr, h0_ptr, cs_ptr, h_ptr, vn_ptr, final_ptr, states_ptr, H,
                       K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                       STATES: tl.constexpr, PREC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2)
    c0 = tl.load(cs_ptr + tl.program_id(0))
    c1 = tl.load(cs_ptr + tl.program_id(0) + 1)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    r64 = tl.arange(0, 64)
    dt = kg_ptr.dtype.element_ty
    sidx = rk[:, None] * V + rv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + (n * H + h) * K * V + sidx).to(tl.float32)
    else:
        S = tl.zeros([K, BV], tl.float32)
    c = c0.to(tl.int64)
    # a while loop: the interpreter cannot turn a loaded scalar into a range bound
    while c < c1:
        cb = (c * H + h) * 64
        tl.store(h_ptr + (c * H + h) * K * V + sidx, S.to(h_ptr.dtype.element_ty))
        wc = tl.load(w_ptr + (cb + r64[:, None]) * K + rk[None, :])
        u = tl.load(u_ptr + (cb + r64[:, None]) * V + rv[None, :]).to(tl.float32)
        u -= tl.dot(wc.to(dt), S.to(dt), input_precision=PREC)
        tl.store(vn_ptr + (cb + r64[:, None]) * V + rv[None, :], u.to(vn_ptr.dtype.element_ty))
        kg = tl.load(kg_ptr + (cb + r64[:, None]) * K + rk[None, :])
        gl = tl.load(gl_ptr + (c * H + h) * K + rk)
        S = S * tl.exp(gl)[:, None] + tl.dot(tl.trans(kg), u.to(dt), input_precision=PREC)
        if STATES:
            tl.store(states_ptr + (c * H + h) * K * V + sidx, S)
        c += 1
    tl.store(final_ptr + (n * H + h) * K * V + sidx, S)


@triton.jit
def _output_kernel(qg_ptr, h_ptr, aqk_ptr, vn_ptr, info_ptr, o_ptr, H,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2)
    t0 = tl.load(info_ptr + c * 4 + 1).to(tl.int64)
    lo = tl.load(info_ptr + c * 4 + 2).to(tl.int64)
    hi = tl.load(info_ptr + c * 4 + 3).to(tl.int64)
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


def _chunk_table(cu: list[int], starts: list[int], C: int):
    """Per chunk (sequence, first row's packed index, valid rows [lo, hi)); per sequence its chunk range."""
    info, offsets = [], [0]
    for i in range(len(cu) - 1):
        front, L = starts[i] % C, cu[i + 1] - cu[i]
        n = -(-(front + L) // C)
        for j in range(n):
            info.append((i, cu[i] - front + j * C, cu[i], cu[i + 1]))
        offsets.append(offsets[-1] + n)
    return info, offsets


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
    info, offsets = _chunk_table(cu, starts, C)
    NC = len(info)
    dev, dt = v.device, v.dtype
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    f32 = torch.float32
    prec = "ieee" if dt == f32 else "tf32"
    o = torch.empty(T, H, V, dtype=dt, device=dev)
    final = torch.empty(N, H, K, V, dtype=f32, device=dev)
    states = torch.empty(max(NC, 1), H, K, V, dtype=f32, device=dev) if output_chunk_states else final
    if NC:
        info_t = torch.tensor(info, dtype=torch.int32, device=dev)
        cs_t = torch.tensor(offsets, dtype=torch.int32, device=dev)
        gc = torch.empty(NC, H, C, K, dtype=f32, device=dev)
        akk = torch.empty(NC, H, C, C, dtype=f32, device=dev)
        aqk = torch.empty(NC, H, C, C, dtype=dt, device=dev)
        w = torch.empty(NC, H, C, K, dtype=f32, device=dev)
        u0 = torch.empty(NC, H, C, V, dtype=f32, device=dev)
        qg = torch.empty(NC, H, C, K, dtype=dt, device=dev)
        kg = torch.empty(NC, H, C, K, dtype=dt, device=dev)
        gl = torch.empty(NC, H, K, dtype=f32, device=dev)
        hs = torch.empty(NC, H, K, V, dtype=dt, device=dev)
        vn = torch.empty(NC, H, C, V, dtype=dt, device=dev)
        _intra_kernel[(NC, H)](q, k, v, g, beta, info_t, gc, akk, aqk, w, u0, qg, kg, gl, H, float(scale),
                               K=K, V=V, PREC=prec, num_warps=8)
        BV = min(V, 32 if N * H < 128 else 64)
        h0 = initial_state.to(f32).contiguous() if initial_state is not None else final
        _recurrence_kernel[(N, H, V // BV)](w, u0, kg, gl, h0, cs_t, hs, vn, final, states, H, K=K, V=V, BV=BV,
                                            HAS_H0=initial_state is not None, STATES=output_chunk_states,
                                            PREC=prec, num_warps=4)
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
