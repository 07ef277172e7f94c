"""Triton MLA attention: absorbed-form paged decode (split-KV, all heads of a block share each latent tile) and
causal prefill attention with a query offset, both returning the per-head log-sum-exp (natural log); the latent
cache write (norm, concatenation and paged store in one kernel); and the absorbed projections of a few decode rows
(one GEMV per head, weights read in place in either orientation)."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import linear as linear_ops
from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue

NUM_SMS = 132
# on: the paged decode's split kernel reads its first block of cached latents before its PDL wait (all but each
# row's newest key, read after it). k3-mini's decode graph on an H100 (2026-12-07, docs/kernels.md): 1.010x at
# batch 1, 1.000x at batch 8 (call 183); 1.000x at batch 1, 1.001x at batch 2 (call 185)
EARLY_KV = True


@triton.jit
def _split_block_step(ql, qr, c, kr, ok, m, l, acc, scale, PREC: tl.constexpr):
    """One block of keys into the online softmax state (m, l, acc) of a split."""
    s = tl.dot(ql, tl.trans(c), input_precision=PREC) + tl.dot(qr, tl.trans(kr), input_precision=PREC)
    s = tl.where(ok[None, :], s * scale, -float("inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PREC)
    return m_new, l, acc


@triton.jit
def _key_rows(pt_ptr, table_row, n, end, PS, stride_page, stride_tok, BN: tl.constexpr):
    """Keys n .. n + BN of a page-table row: (positions, which are < end, each key's cache offset)."""
    pos = n + tl.arange(0, BN)
    ok = pos < end
    page = tl.load(pt_ptr + table_row + pos // PS, mask=ok, other=0).to(tl.int64)
    return pos, ok, page * stride_page + (pos % PS) * stride_tok


@triton.jit
def _decode_split_kernel(ql_ptr, qr_ptr, kv_ptr, pt_ptr, sl_ptr, mo_ptr, ml_ptr,
                         H, R, DR, D, PS, TPR, stride_pt, NS, scale, stride_page, stride_tok, stride_qrb, stride_qrh,
                         BH: tl.constexpr, BR: tl.constexpr, BDR: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                         PDL: tl.constexpr, EARLY: tl.constexpr):
    """Split sid of row b's keys for a block of BH heads, merged later by the combine.

    With EARLY (one query row per table row, TPR = 1), the split's first block of keys is read before the wait: the
    page table, the lengths and the cached latents of earlier steps do not depend on the kernels before this one;
    only the row's newest key (position seq_len - 1, stored by this step) is read again after the wait."""
    if PDL:
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    sid = tl.program_id(2)
    heads = hb * BH + tl.arange(0, BH)
    hm = heads < H
    rr = tl.arange(0, BR)
    rd = tl.arange(0, BDR)
    dt = ql_ptr.dtype.element_ty
    seq_len = tl.load(sl_ptr + b).to(tl.int32)
    split = tl.cdiv(tl.cdiv(seq_len, NS), BN) * BN
    start = sid * split
    end = tl.minimum(start + split, seq_len)
    m = tl.full([BH], -float("inf"), tl.float32)
    l = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, BR], tl.float32)
    n = start
    table_row = (b // TPR) * stride_pt
    if EARLY:
        pos, ok, row = _key_rows(pt_ptr, table_row, n, end, PS, stride_page, stride_tok, BN)
        c_ptrs = kv_ptr + row[:, None] + rr[None, :]
        r_ptrs = kv_ptr + row[:, None] + R + rd[None, :]
        old = ok & (pos < seq_len - 1)
        c = tl.load(c_ptrs, mask=old[:, None] & (rr[None, :] < R), other=0.0)
        kr = tl.load(r_ptrs, mask=old[:, None] & (rd[None, :] < DR), other=0.0)
    if PDL:
        gdc_wait()
    ql = tl.load(ql_ptr + (b * H + heads[:, None]) * R + rr[None, :], mask=hm[:, None] & (rr[None, :] < R), other=0.0)
    qr = tl.load(qr_ptr + b * stride_qrb + heads[:, None] * stride_qrh + rd[None, :],
                 mask=hm[:, None] & (rd[None, :] < DR), other=0.0)
    if EARLY:
        if n < end:
            new = pos == seq_len - 1
            c = tl.load(c_ptrs, mask=new[:, None] & (rr[None, :] < R), other=c).to(dt)
            kr = tl.load(r_ptrs, mask=new[:, None] & (rd[None, :] < DR), other=kr).to(dt)
            m, l, acc = _split_block_step(ql, qr, c, kr, ok, m, l, acc, scale, PREC)
        n += BN
    while n < end:
        pos, ok, row = _key_rows(pt_ptr, table_row, n, end, PS, stride_page, stride_tok, BN)
        c = tl.load(kv_ptr + row[:, None] + rr[None, :], mask=ok[:, None] & (rr[None, :] < R), other=0.0).to(dt)
        kr = tl.load(kv_ptr + row[:, None] + R + rd[None, :], mask=ok[:, None] & (rd[None, :] < DR), other=0.0).to(dt)
        m, l, acc = _split_block_step(ql, qr, c, kr, ok, m, l, acc, scale, PREC)
        n += BN
    has = l > 0
    out = acc / tl.where(has, l, 1.0)[:, None]
    lse = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), -float("inf"))
    base = (b * H + heads) * NS + sid
    tl.store(mo_ptr + base[:, None] * R + rr[None, :], out, mask=hm[:, None] & (rr[None, :] < R))
    tl.store(ml_ptr + base, lse, mask=hm)


@triton.jit
def _combine_row(mo_ptr, ml_ptr, row, R, NS, BR: tl.constexpr, BS: tl.constexpr):
    """One (token, head) row's split results merged: (out_lat [BR] fp32, the largest lse, the weights' sum)."""
    rs = tl.arange(0, BS)
    rr = tl.arange(0, BR)
    lses = tl.load(ml_ptr + row * NS + rs, mask=rs < NS, other=-float("inf"))
    mx = tl.max(lses, 0)
    mx = tl.where(mx == -float("inf"), 0.0, mx)
    wts = tl.exp(lses - mx)
    tot = tl.sum(wts, 0)
    o = tl.load(mo_ptr + (row * NS + rs[:, None]) * R + rr[None, :], mask=(rs[:, None] < NS) & (rr[None, :] < R),
                other=0.0)
    return tl.sum(o * wts[:, None], 0) / tot, mx, tot


@triton.jit
def _decode_combine_kernel(mo_ptr, ml_ptr, out_ptr, lse_ptr, R, NS, BR: tl.constexpr, BS: tl.constexpr,
                           PDL: tl.constexpr):
    pdl_prologue(PDL)
    bh = tl.program_id(0).to(tl.int64)
    rr = tl.arange(0, BR)
    out, mx, tot = _combine_row(mo_ptr, ml_ptr, bh, R, NS, BR, BS)
    tl.store(out_ptr + bh * R + rr, out.to(out_ptr.dtype.element_ty), mask=rr < R)
    tl.store(lse_ptr + bh, mx + tl.log(tot))


def num_splits(batch: int, head_blocks: int, max_tokens: int) -> int:
    """Static split count (CUDA graphs fix it at capture): enough programs to fill the GPU, >= 32 keys each.

    Measured on an H200 at batch 1, ctx 1024 (graph-timed, both launches): 5 splits 22.5 us, 17 splits 11.2 us,
    33 splits 9.9 us (docs/kernels.md).
    """
    return int(max(1, min(64, triton.cdiv(max_tokens, 32), (2 * NUM_SMS) // max(1, batch * head_blocks))))


def _decode_split(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float,
                  rows_per_table: int = 1):
    """The split-K pass of the paged decode (B >= 1 rows): per (row, head, split) out_lat [B, H, NS, R] and lse
    [B, H, NS], fp32."""
    B, H, R = q_lat.shape
    DR = q_rope.shape[-1]
    P, PS, D = kv_buffer.shape
    assert R == kv_lora_rank and D == R + DR, "latent width mismatch"
    assert kv_buffer.stride(2) == 1, "latent rows must be contiguous"
    BH = 16
    HB = triton.cdiv(H, BH)
    MAXP = page_table.shape[1]
    NS = num_splits(B, HB, MAXP * PS)
    if page_table.stride(1) != 1:
        page_table = page_table.contiguous()
    mo = torch.empty(B, H, NS, R, dtype=torch.float32, device=q_lat.device)
    ml = torch.empty(B, H, NS, dtype=torch.float32, device=q_lat.device)
    prec = "ieee" if q_lat.dtype == torch.float32 else "tf32"
    BR = triton.next_power_of_2(R)
    # q_rope is read in place (it is usually the last columns of q): only its rows need not be contiguous
    q_rope = q_rope if q_rope.stride(-1) == 1 else q_rope.contiguous()
    _decode_split_kernel[(B, HB, NS)](
        q_lat.contiguous(), q_rope, kv_buffer, page_table, seq_lens, mo, ml,
        H, R, DR, D, PS, rows_per_table, page_table.stride(0), NS, float(scale), kv_buffer.stride(0), kv_buffer.stride(1), q_rope.stride(0),
        q_rope.stride(1), BH=BH, BR=BR, BDR=max(16, triton.next_power_of_2(DR)),
        BN=32 if BR >= 512 else 64, PREC=prec, EARLY=EARLY_KV and rows_per_table == 1,
        num_warps=8 if BR >= 512 else 4, num_stages=2, **pdl_args(kv_buffer))
    return mo, ml


def _splits_block(NS: int) -> int:
    """The block a merge of NS split results loads them in."""
    return max(2, triton.next_power_of_2(NS))


def mla_decode_paged(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float,
                     rows_per_table: int = 1):
    """See reference.mla_decode_paged. Returns out_lat [B, H, R] in q_lat's dtype and lse [B, H] fp32.
    rows_per_table: query rows b read page-table row b // rows_per_table (a verify block's tokens share their
    request's row, read in place)."""
    if q_lat.dtype == torch.float64:
        from kestrel.ops.mla.reference import mla_decode_paged as ref
        if rows_per_table > 1:
            page_table = page_table.repeat_interleave(rows_per_table, 0)
        return ref(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale)
    B, H, R = q_lat.shape
    out = torch.empty(B, H, R, dtype=q_lat.dtype, device=q_lat.device)
    lse = torch.empty(B, H, dtype=torch.float32, device=q_lat.device)
    if B == 0:
        return out, lse
    mo, ml = _decode_split(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale, rows_per_table)
    NS = ml.shape[-1]
    _decode_combine_kernel[(B * H,)](mo, ml, out, lse, R, NS, BR=triton.next_power_of_2(R), BS=_splits_block(NS),
                                     num_warps=4, **pdl_args(mo))
    return out, lse


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, Tq, S, H, DK, DV, q_offset, scale,
                     sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                     CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                     PREC: tl.constexpr):
    _attn_block(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, tl.program_id(0), tl.program_id(1).to(tl.int64), Tq, S, H, DK,
                DV, q_offset, scale, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, CAUSAL, BM, BN, BD, BDV, PREC)


@triton.jit
def _attn_varlen_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, blocks_ptr, cuq_ptr, cuk_ptr, off_ptr, H, DK, DV, scale,
                        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                        CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                        BDV: tl.constexpr, PREC: tl.constexpr):
    """Packed sequences: program (b, h) takes query block b of the block table (its sequence i and block index
    within it, blocks_ptr[2 b], [2 b + 1]); sequence i's queries are rows cuq[i]..cuq[i + 1] of q, its keys rows
    cuk[i]..cuk[i + 1] of k and v, its first query at position off[i]."""
    pid = tl.program_id(0)
    i = tl.load(blocks_ptr + 2 * pid)
    mb = tl.load(blocks_ptr + 2 * pid + 1)
    q0 = tl.load(cuq_ptr + i).to(tl.int64)
    k0 = tl.load(cuk_ptr + i).to(tl.int64)
    Tq = tl.load(cuq_ptr + i + 1) - q0
    S = tl.load(cuk_ptr + i + 1) - k0
    _attn_block(q_ptr + q0 * sq_t, k_ptr + k0 * sk_t, v_ptr + k0 * sv_t, o_ptr + q0 * H * DV, lse_ptr + q0 * H, mb,
                tl.program_id(1).to(tl.int64), Tq, S, H, DK, DV, tl.load(off_ptr + i), scale, sq_t, sq_h, sk_t, sk_h,
                sv_t, sv_h, CAUSAL, BM, BN, BD, BDV, PREC)


@triton.jit
def _attn_block(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, mb, h, Tq, S, H, DK, DV, q_offset, scale,
                sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                PREC: tl.constexpr):
    """Query block mb of one sequence, head h: online softmax over its keys (causal: up to the block's last
    position); writes out [Tq, H, DV] and lse [Tq, H] rows."""
    rm = mb * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, BD)
    rdv = tl.arange(0, BDV)
    qm = rm < Tq
    q = tl.load(q_ptr + rm[:, None].to(tl.int64) * sq_t + h * sq_h + rd[None, :], mask=qm[:, None] & (rd[None, :] < DK), other=0.0)
    dt = q.dtype
    m = tl.full([BM], -float("inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    qpos = rm + q_offset
    if CAUSAL:
        end = tl.minimum(S, q_offset + (mb + 1) * BM)
    else:
        end = S
    n = 0
    while n < end:
        kn = n + rn
        km = kn < S
        k = tl.load(k_ptr + kn[:, None].to(tl.int64) * sk_t + h * sk_h + rd[None, :], mask=km[:, None] & (rd[None, :] < DK), other=0.0)
        v = tl.load(v_ptr + kn[:, None].to(tl.int64) * sv_t + h * sv_h + rdv[None, :], mask=km[:, None] & (rdv[None, :] < DV), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        ok = km[None, :]
        if CAUSAL:
            ok = ok & (kn[None, :] <= qpos[:, None])
        s = tl.where(ok, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dt), v, input_precision=PREC)
        m = m_new
        n += BN
    out = acc / l[:, None]
    tl.store(o_ptr + (rm[:, None].to(tl.int64) * H + h) * DV + rdv[None, :], out.to(o_ptr.dtype.element_ty),
             mask=qm[:, None] & (rdv[None, :] < DV))
    tl.store(lse_ptr + rm.to(tl.int64) * H + h, m + tl.log(l), mask=qm)


def _attn_config(DK: int, DV: int, Tq: int, dtype) -> dict:
    """Tiles and precision of the prefill attention kernels for head widths DK / DV and (longest) Tq queries."""
    BD, BDV = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    BM = 64 if Tq > 32 else 16
    fp32 = dtype == torch.float32
    return dict(BM=BM, BN=32 if BD >= 256 or fp32 else 64, BD=BD, BDV=BDV, PREC="ieee" if fp32 else "tf32",
                num_warps=8 if BM == 64 else 4, num_stages=2)


def attention_with_lse(q, k, v, scale: float, q_offset: int, causal: bool = True):
    """See reference.attention_with_lse: out [Tq, H, Dv] in q's dtype, lse [Tq, H] fp32."""
    if q.dtype == torch.float64:
        from kestrel.ops.mla.reference import attention_with_lse as ref
        return ref(q, k, v, scale, q_offset, causal)
    Tq, H, DK = q.shape
    S, DV = k.shape[0], v.shape[-1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(Tq, H, DV, dtype=q.dtype, device=q.device)
    lse = torch.empty(Tq, H, dtype=torch.float32, device=q.device)
    if Tq == 0:
        return out, lse
    cfg = _attn_config(DK, DV, Tq, q.dtype)
    _attn_fwd_kernel[(triton.cdiv(Tq, cfg["BM"]), H)](
        q, k, v, out, lse, Tq, S, H, DK, DV, int(q_offset), float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), CAUSAL=causal, **cfg)
    return out.to(q.dtype), lse


def attention_varlen_with_lse(q, k, v, scale: float, cu_q: list[int], cu_k: list[int], q_offsets: list[int],
                              causal: bool = True):
    """See reference.attention_varlen_with_lse: every sequence in one launch (a block table of (sequence, query
    block) pairs), where a loop over attention_with_lse costs a launch, and the ops around it, per sequence."""
    if q.dtype == torch.float64:
        from kestrel.ops.mla.reference import attention_varlen_with_lse as ref
        return ref(q, k, v, scale, cu_q, cu_k, q_offsets, causal)
    T, H, DK = q.shape
    DV = v.shape[-1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(T, H, DV, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    lens = [b - a for a, b in zip(cu_q, cu_q[1:])]
    if T == 0:
        return out, lse
    cfg = _attn_config(DK, DV, max(lens), q.dtype)
    BM = cfg["BM"]
    blocks = [(i, mb) for i, L in enumerate(lens) for mb in range(triton.cdiv(L, BM))]
    meta = torch.tensor([x for pair in blocks for x in pair] + list(cu_q) + list(cu_k) + list(q_offsets),
                        dtype=torch.int32).to(q.device, non_blocking=True)
    n, nb = len(lens), len(blocks)
    table, cuq, cuk, off = meta.split([2 * nb, n + 1, n + 1, n])
    _attn_varlen_kernel[(nb, H)](
        q, k, v, out, lse, table, cuq, cuk, off, H, DK, DV, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), CAUSAL=causal, **cfg)
    return out, lse


@triton.jit
def _store_latent_kernel(x_ptr, w_ptr, loc_ptr, kv_ptr, R, D, stride_x, eps, BR: tl.constexpr, BD: tl.constexpr,
                         PDL: tl.constexpr):
    """One token: RMSNorm of c_kv (the norm kernel's roundings: normalised row cast to x's dtype, then the weight),
    k_r copied, both cast to the cache's dtype and stored at the token's flat slot."""
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    dst = kv_ptr + tl.load(loc_ptr + t).to(tl.int64) * D
    rr = tl.arange(0, BR)
    x = tl.load(x_ptr + t * stride_x + rr, mask=rr < R, other=0.0)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / R + eps)
    y = (xf * r).to(x.dtype).to(tl.float32) * tl.load(w_ptr + rr, mask=rr < R, other=0.0).to(tl.float32)
    tl.store(dst + rr, y.to(x.dtype).to(kv_ptr.dtype.element_ty), mask=rr < R)
    rd = R + tl.arange(0, BD)
    k_r = tl.load(x_ptr + t * stride_x + rd, mask=rd < D, other=0.0)
    tl.store(dst + rd, k_r.to(kv_ptr.dtype.element_ty), mask=rd < D)


def store_latent(kv_a, weight, eps: float, rank: int, kv_buffer, loc):
    """See reference.store_latent. kv_a may be a column slice of a wider GEMM output (rows strided)."""
    D = kv_a.shape[-1]
    if kv_a.dtype == torch.float64 or weight.dtype != kv_a.dtype or kv_a.stride(-1) != 1 or D == rank \
            or not kv_buffer.is_contiguous():
        from kestrel.ops.mla.reference import store_latent as ref
        return ref(kv_a, weight, eps, rank, kv_buffer, loc)
    if kv_a.shape[0]:
        _store_latent_kernel[(kv_a.shape[0],)](kv_a, weight, loc, kv_buffer, rank, D, kv_a.stride(0), eps,
                                               BR=triton.next_power_of_2(rank),
                                               BD=triton.next_power_of_2(D - rank), num_warps=4, **pdl_args(kv_a))


@triton.jit
def _head_gemv_kernel(x_ptr, w_ptr, y_ptr, T, H, N, K, sxt, sxh, swh, swn, swk, syt, syh, ml_ptr, NS,
                      BN: tl.constexpr, KP: tl.constexpr, PDL: tl.constexpr, ROW_GRID: tl.constexpr,
                      COMBINE: tl.constexpr, BS: tl.constexpr):
    """y[t, h, n-block] = w[h, n-block, :] . x[t, h, :] for every row t: the [BN, K] weight tile is loaded whole
    before the wait (the weights do not depend on the previous kernel), then each row's x after it.

    With COMBINE, x is the paged decode's split results (x_ptr: out_lat [T, H, NS, K] fp32, ml_ptr: lse
    [T, H, NS]), each row merged (_combine_row, as the combine kernel merges it, rounded to y's dtype as its output
    is) by every program that reads it."""
    h = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, KP)
    if PDL:
        gdc_launch_dependents()
    w = tl.load(w_ptr + h * swh + rn[:, None] * swn + rk[None, :] * swk, mask=(rn[:, None] < N) & (rk[None, :] < K),
                other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
    t = 0
    if ROW_GRID:  # one row per program (grid axis 2)
        t = tl.program_id(2)
        T = t + 1
    while t < T:  # (a while loop: the interpreter cannot bound a range by an argument that was specialised to 1)
        if COMBINE:
            x = _combine_row(x_ptr, ml_ptr, t * H + h, K, NS, KP, BS)[0].to(y_ptr.dtype.element_ty).to(tl.float32)
        else:
            x = tl.load(x_ptr + t * sxt + h * sxh + rk, mask=rk < K, other=0.0).to(tl.float32)
        y = tl.sum(w * x[None, :], 1)
        tl.store(y_ptr + t * syt + h * syh + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)
        t += 1


# rows a head_gemv call takes (more go to the batched matmul: the kernel loops over rows with its tile resident)
HEAD_GEMV_MAX_ROWS = 8


def _head_gemv_launch(x, w, y, T: int, H: int, K: int, split=None):
    """The head GEMV's launch over rows of x [T, H, K] or, with split = (out_lat, lse), over the paged decode's
    split results, merged in the kernel."""
    N = w.shape[1]
    KP = triton.next_power_of_2(K)
    BN = max(1, min(triton.next_power_of_2(N), 8192 // KP))
    row_grid = T > 1 and linear_ops.small_weight(w)  # each row its own programs, as the linear GEMV gives them
    ml, NS = (split[1], split[1].shape[-1]) if split is not None else (x, 0)
    _head_gemv_kernel[(H, triton.cdiv(N, BN), T if row_grid else 1)](
        x, w, y, T, H, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), y.stride(0), y.stride(1),
        ml, NS, BN=BN, KP=KP, ROW_GRID=row_grid, COMBINE=split is not None, BS=_splits_block(NS), num_warps=4,
        **pdl_args(x))


def head_gemv(x, w):
    """See reference.head_gemv: y[t, h] = w[h] x[t, h], w [H, N, K] in any strides (a transposed view reads the
    weights in place)."""
    T, H, K = x.shape
    if x.dtype == torch.float64 or T > HEAD_GEMV_MAX_ROWS or x.stride(-1) != 1 or K > 1024:
        from kestrel.ops.mla.reference import head_gemv as ref
        return ref(x, w)
    y = torch.empty(T, H, w.shape[1], dtype=x.dtype, device=x.device)
    if T:
        _head_gemv_launch(x, w, y, T, H, K)
    return y


def mla_decode_project(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float, w):
    """head_gemv(mla_decode_paged(...)[0], w) (w: W_uv [H, N, R]) with the split results merged inside the head
    GEMV's programs: no combine launch, no out_lat round trip; each row's merge repeated by its head's programs."""
    T, H, R = q_lat.shape
    if q_lat.dtype == torch.float64 or T > HEAD_GEMV_MAX_ROWS or R > 1024 or T == 0:
        return head_gemv(mla_decode_paged(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale)[0], w)
    split = _decode_split(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale)
    y = torch.empty(T, H, w.shape[1], dtype=q_lat.dtype, device=q_lat.device)
    _head_gemv_launch(split[0], w, y, T, H, R, split=split)
    return y
