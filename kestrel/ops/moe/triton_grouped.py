"""Triton MoE for large batches: (token, expert) pairs sorted by expert on the device (fixed-size buffers, no host
sync) into BM-row blocks, then a grouped GEMM per projection with the activation fused into the up projection.
MXFP4 experts are dequantised in-kernel (kestrel.ops.moe.triton._load_w)."""

import torch
import triton
import triton.language as tl

from kestrel.ops.moe.triton import _load_w
from kestrel.ops.triton_utils import act as _act


@triton.jit
def _grouped_up_kernel(x_ptr, pairs_ptr, bexp_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, NP,
                       beta, linear_beta, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       QUANT: tl.constexpr, SITU: tl.constexpr, PREC: tl.constexpr):
    blk = tl.program_id(0)
    nb = tl.program_id(1)
    e = tl.load(bexp_ptr + blk).to(tl.int64)
    if e >= 0:
        pr = tl.load(pairs_ptr + blk * BM + tl.arange(0, BM)).to(tl.int64)
        pm = pr < NP
        tok = tl.where(pm, pr // TOPK, 0)
        rows = nb * BN + tl.arange(0, BN)
        dt = h_ptr.dtype.element_ty
        a = tl.zeros([BM, BN], tl.float32)
        b = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, D, BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + tok[:, None] * D + cols[None, :], mask=pm[:, None] & (cols[None, :] < D), other=0.0)
            w1 = _load_w(w1_ptr, s1_ptr, e, rows, cols, I, D, QUANT).to(dt)
            w3 = _load_w(w3_ptr, s3_ptr, e, rows, cols, I, D, QUANT).to(dt)
            a = tl.dot(x.to(dt), tl.trans(w1), a, input_precision=PREC)
            b = tl.dot(x.to(dt), tl.trans(w3), b, input_precision=PREC)
        y = _act(a.to(dt).to(tl.float32), b.to(dt).to(tl.float32), beta, linear_beta, SITU)
        tl.store(h_ptr + pr[:, None] * I + rows[None, :], y.to(dt), mask=pm[:, None] & (rows[None, :] < I))


@triton.jit
def _grouped_down_kernel(h_ptr, pairs_ptr, bexp_ptr, wts_ptr, w2_ptr, s2_ptr, out_ptr, D: tl.constexpr, I: tl.constexpr, NP,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, QUANT: tl.constexpr,
                         PREC: tl.constexpr):
    blk = tl.program_id(0)
    nb = tl.program_id(1)
    e = tl.load(bexp_ptr + blk).to(tl.int64)
    if e >= 0:
        pr = tl.load(pairs_ptr + blk * BM + tl.arange(0, BM)).to(tl.int64)
        pm = pr < NP
        prs = tl.where(pm, pr, 0)
        rows = nb * BN + tl.arange(0, BN)
        dt = h_ptr.dtype.element_ty
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, I, BK):
            cols = k0 + tl.arange(0, BK)
            hv = tl.load(h_ptr + prs[:, None] * I + cols[None, :], mask=pm[:, None] & (cols[None, :] < I), other=0.0)
            w2 = _load_w(w2_ptr, s2_ptr, e, rows, cols, D, I, QUANT).to(dt)
            acc = tl.dot(hv, tl.trans(w2), acc, input_precision=PREC)
        wv = tl.load(wts_ptr + prs, mask=pm, other=0.0).to(dt).to(tl.float32)
        y = acc.to(dt).to(tl.float32) * wv[:, None]
        tl.store(out_ptr + prs[:, None] * D + rows[None, :], y, mask=pm[:, None] & (rows[None, :] < D))


@triton.jit
def _block_table_kernel(keys_ptr, order_ptr, bounds_ptr, pairs_ptr, bexp_ptr, NP, E, EP: tl.constexpr,
                        BM: tl.constexpr):
    """Block b of the expert-sorted pair table: its expert (the number of experts whose BM-padded run ends at or
    before the block) and its BM pair indices (order[] in that expert's run, NP past the run's end). bounds[e] is
    where expert e's run starts among the sorted keys (E + 1 entries)."""
    b = tl.program_id(0)
    re = tl.arange(0, EP)
    lo = tl.load(bounds_ptr + re, mask=re < E, other=0)
    hi = tl.load(bounds_ptr + 1 + re, mask=re < E, other=0)
    count = hi - lo
    padded = (count + BM - 1) // BM * BM
    pend = tl.cumsum(padded, 0)
    start = b * BM
    e = tl.sum((pend <= start).to(tl.int32), 0)  # (padding experts end at the last real one's end: counted too)
    mine = re == e
    pstart = tl.sum(tl.where(mine, pend - padded, 0), 0)
    cstart = tl.sum(tl.where(mine, lo, 0), 0)
    n = tl.sum(tl.where(mine, count, 0), 0)
    rank = start + tl.arange(0, BM) - pstart
    ok = (e < E) & (rank < n)
    src = tl.load(order_ptr + cstart + rank, mask=ok, other=NP)
    tl.store(pairs_ptr + start + tl.arange(0, BM), tl.where(ok, src, NP))
    tl.store(bexp_ptr + b, tl.where(e < E, e, -1))


_EXPERT_IDS: dict = {}  # (E, key dtype, device) -> arange(E + 1): the run boundaries' search values


def sort_pairs(ids: torch.Tensor, E: int, BM: int):
    """Pairs grouped by expert into BM-row blocks, all on the device with static sizes (graph-safe): the expert ids
    sorted (stable), each expert's run located by a search, then one launch builds the block table. The same
    table as `sort_pairs_reference` in a handful of launches instead of ~25.

    Returns pairs [NB * BM] (pair index, or NP for padding) and block_expert [NB] (-1 for unused blocks).
    """
    NP = ids.numel()
    NB = triton.cdiv(NP, BM) + E
    # expert ids as 16-bit keys: the device's radix sort then takes two passes of 8 bits, not eight (a k3-mini
    # prefill of 2048 tokens sorted 16K int64 keys in 8 launches a MoE layer); stable either way, so the same order
    flat = ids.reshape(-1)
    keys, order = torch.sort(flat.to(torch.int16) if E <= torch.iinfo(torch.int16).max else flat, stable=True)
    key = (E, keys.dtype, ids.device)
    search = _EXPERT_IDS.get(key)
    if search is None:
        search = _EXPERT_IDS[key] = torch.arange(E + 1, dtype=keys.dtype, device=ids.device)
    bounds = torch.searchsorted(keys, search)
    pairs = torch.empty(NB * BM, dtype=torch.int64, device=ids.device)
    bexp = torch.empty(NB, dtype=torch.int64, device=ids.device)
    _block_table_kernel[(NB,)](keys, order, bounds, pairs, bexp, NP, E, EP=triton.next_power_of_2(E), BM=BM,
                               num_warps=1 if BM <= 32 else 2)
    return pairs, bexp


def sort_pairs_reference(ids: torch.Tensor, E: int, BM: int):
    """sort_pairs in torch ops (its oracle)."""
    NP = ids.numel()
    flat = ids.reshape(-1)
    NB = triton.cdiv(NP, BM) + E
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(E, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BM - 1) // BM * BM
    pend = torch.cumsum(padded, 0)
    pstart = pend - padded
    cstart = torch.cumsum(counts, 0) - counts
    sorted_e = flat[order]
    rank = torch.arange(NP, device=ids.device) - cstart[sorted_e]
    pairs = torch.full((NB * BM,), NP, dtype=torch.int64, device=ids.device)
    pairs.scatter_(0, pstart[sorted_e] + rank, order)
    bstart = torch.arange(NB, device=ids.device) * BM
    bexp = torch.searchsorted(pend, bstart, right=True)
    bexp = torch.where(bexp < E, bexp, -1)
    return pairs, bexp


def grouped_experts(x, ids, weights, w1s, w2s, w3s, h, act, quant: bool):
    """sum_k weights[t, k] * expert_{ids[t, k]}(x_t) for x [T, D] through the grouped GEMMs: w1s, w2s, w3s are
    (weight, scales) as kestrel.ops.moe.triton._weights gives them, h an [T * k, I] buffer for the activations."""
    (w1, s1), (w2, s2), (w3, s3) = w1s, w2s, w3s
    T, D = x.shape
    TOPK = ids.shape[1]
    NP, I = h.shape
    Dout = w2.shape[1]
    BM = 64 if NP >= 4096 else 16
    pairs, bexp = sort_pairs(ids, w1.shape[0], BM)
    NB = bexp.numel()
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    BN, BK = 64, 64
    _grouped_up_kernel[(NB, triton.cdiv(I, BN))](x, pairs, bexp, w1, s1, w3, s3, h, D, I, TOPK, NP, act.beta,
                                                 act.linear_beta, BM=BM, BN=BN, BK=BK, QUANT=quant,
                                                 SITU=act.kind == "situ", PREC=prec, num_warps=4, num_stages=3)
    y = torch.empty(NP, Dout, dtype=torch.float32, device=x.device)
    _grouped_down_kernel[(NB, triton.cdiv(Dout, BN))](h, pairs, bexp, weights, w2, s2, y, Dout, I, NP, BM=BM, BN=BN,
                                                      BK=BK, QUANT=quant, PREC=prec, num_warps=4, num_stages=3)
    return y.view(T, TOPK, Dout).sum(1).to(x.dtype)
