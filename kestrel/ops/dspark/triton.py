"""Triton kernels of the DSpark drafter's sequential correction (see reference.py), one program per row and tile of
outputs. Under programmatic dependent launch each program loads its weight tile before it waits for the previous
kernel (the weights are parameters: no kernel in flight writes them)."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl
from kestrel.ops.triton_utils import launch

MIN_KEY = tl.constexpr(-9223372036854775808)  # below every key
# the largest weight tile (elements) a program holds
TILE = 8192


@triton.jit
def _low():
    return tl.full([], 0xFFFFFFFF, tl.int64)


@triton.jit
def _tile_then_wait(w_ptr, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """(rows, cols, the [BN, KP] tile of a row-major [N, K] weight at program_id(0)): under PDL the dependents may
    launch and the tile is loaded before the wait for the previous kernel (parameters: no kernel in flight writes
    them)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, KP)
    if PDL:
        gdc_launch_dependents()
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < K),
                other=0.0)
    if PDL:
        gdc_wait()
    return rows, cols, w


@triton.jit
def _rms_piece(ptr, cols, lo, n, eps):
    """Columns [lo, lo + n) of a row, RMS-normalised alone (fp32 math) and rounded to the row's dtype; 0 elsewhere."""
    on = (cols >= lo) & (cols < lo + n)
    x = tl.load(ptr + (cols - lo), mask=on, other=0.0)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n + eps)
    return tl.where(on, (xf * r).to(x.dtype).to(tl.float32), 0.0)


@triton.jit
def _correct_up_kernel(slot_ptr, state_ptr, prev_ptr, emb_ptr, w_ptr, y_ptr, C, eps, P,
                       D: tl.constexpr, T: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, PP: tl.constexpr,
                       KEYS: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    K: tl.constexpr = 2 * D + T
    rows, cols, w = _tile_then_wait(w_ptr, C, K, KP, BN, PDL)
    if KEYS:  # the previous position's partial argmax keys: the best of them
        rp = tl.arange(0, PP)
        keys = tl.load(prev_ptr + b * P + rp, mask=rp < P, other=MIN_KEY)
        tok = _low() - (tl.max(keys, 0) & _low())
    else:
        tok = tl.load(prev_ptr + b)
    u = _rms_piece(slot_ptr + b * D, cols, 0, D, eps)
    u += _rms_piece(state_ptr + b * D, cols, D, D, eps)
    u += _rms_piece(emb_ptr + tok * T, cols, 2 * D, T, eps)
    acc = tl.sum(w.to(tl.float32) * u[None, :], 1)
    a = acc.to(y_ptr.dtype.element_ty).to(tl.float32)  # the projection's output, then torch's silu on it
    tl.store(y_ptr + b * C + rows, (a * tl.sigmoid(a)).to(y_ptr.dtype.element_ty), mask=rows < C)


def correct_up(slot: torch.Tensor, state: torch.Tensor, prev: torch.Tensor, emb: torch.Tensor, w_up: torch.Tensor,
               eps: float) -> torch.Tensor:
    """See reference.correct_up (fp64 goes to the reference)."""
    B, D = slot.shape
    T = emb.shape[1]
    C, K = w_up.shape
    if slot.dtype == torch.float64:
        from kestrel.ops.dspark.reference import correct_up as ref
        return ref(slot, state, prev, emb, w_up, eps)
    assert K == 2 * D + T and state.shape == slot.shape and w_up.is_contiguous() and emb.is_contiguous()
    slot, state, prev = slot.contiguous(), state.contiguous(), prev.contiguous()
    y = torch.empty(B, C, dtype=slot.dtype, device=slot.device)
    KP = triton.next_power_of_2(K)
    BN = max(1, min(16, TILE // KP))
    P = prev.shape[1] if prev.dim() == 2 else 1
    use_pdl = pdl(slot)
    if B:
        launch(_correct_up_kernel, (triton.cdiv(C, BN), B), slot, state, prev, emb, w_up, y, C, eps, P, D=D, T=T,
               KP=KP, BN=BN, PP=triton.next_power_of_2(P), KEYS=prev.dim() == 2, PDL=use_pdl, launch_pdl=use_pdl,
               num_warps=4, num_stages=1)
    return y


@triton.jit
def _head_keys_kernel(h_ptr, w_ptr, keys_ptr, N, NB, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr,
                      PDL: tl.constexpr):
    nb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows, cols, w = _tile_then_wait(w_ptr, N, K, KP, BN, PDL)
    h = tl.load(h_ptr + b * K + cols, mask=cols < K, other=0.0)
    logit = tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], 1).to(h.dtype).to(tl.float32)  # as the output rounds
    bits = (logit + 0.0).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (_low() - rows.to(tl.int64))
    key = tl.where(rows < N, key, MIN_KEY)
    tl.store(keys_ptr + b * NB + nb, tl.max(key, 0))


def head_keys(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """See reference.head_keys: here one key per program's tile of the vocabulary, [B, P] (fp64 goes to the
    reference)."""
    if h.dtype == torch.float64:
        from kestrel.ops.dspark.reference import head_keys as ref
        return ref(h, w)
    B, K = h.shape
    N = w.shape[0]
    assert w.shape[1] == K and w.is_contiguous() and w.dtype == h.dtype
    h = h.contiguous()
    KP = triton.next_power_of_2(K)
    BN = max(1, min(64, TILE // KP))
    NB = triton.cdiv(N, BN)
    keys = torch.empty(B, NB, dtype=torch.int64, device=h.device)
    use_pdl = pdl(h)
    if B:
        launch(_head_keys_kernel, (NB, B), h, w, keys, N, NB, K=K, KP=KP, BN=BN, PDL=use_pdl, launch_pdl=use_pdl,
               num_warps=4, num_stages=1)
    return keys


# vocabulary entries an acceptance program compares at a time
ACCEPT_BV = 4096


@triton.jit
def _accept_kernel(logits_ptr, drafts_ptr, keep_ptr, n_ptr, snap_ptr, packed_ptr, commit_ptr, snaps_ptr, rows_ptr,
                   V, G, L: tl.constexpr, LP: tl.constexpr, GP: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    rl = tl.arange(0, LP)
    rv = tl.arange(0, BV)
    top = tl.zeros([LP], tl.int64)
    for j in tl.static_range(L):  # each position's argmax, the first of equal values (as torch.argmax)
        row = logits_ptr + (b * L + j) * V
        best = tl.full([], float("-inf"), tl.float32)
        arg = tl.zeros([], tl.int64)
        v0 = 0
        while v0 < V:  # (a while loop: the interpreter cannot bound a range by an argument)
            x = tl.load(row + v0 + rv, mask=v0 + rv < V, other=float("-inf")).to(tl.float32)
            m = tl.max(x, 0)
            i = tl.min(tl.where(x == m, v0 + rv, V), 0).to(tl.int64)
            take = m > best
            arg = tl.where(take, i, arg)
            best = tl.where(take, m, best)
            v0 += BV
        top = tl.where(rl == j, arg, top)
    rg = tl.arange(0, GP)
    drafts = tl.load(drafts_ptr + b * G + rg, mask=rg < G, other=-1)
    keep = tl.load(keep_ptr + b)
    # match at position j < L - 1: draft j equals the target's token there and the block may accept it
    d = tl.sum(tl.where(rg[:, None] == rl[None, :], drafts[:, None], 0), 0)  # drafts on the positions' axis
    ok = (d == top) & (rl < L - 1) & (rl < keep)
    acc = tl.min(tl.where(ok, L - 1, rl), 0).to(tl.int64)  # the first position that fails (L - 1: none)
    n = tl.load(n_ptr + b)
    commit = tl.where(n > 0, acc + 1, 0)
    snap = tl.load(snap_ptr + b)
    snap = tl.where((snap > 0) & (snap <= commit), snap, 0)
    final = tl.sum(tl.where(rl == acc, top, 0), 0)
    tl.store(packed_ptr + b * (G + 2) + rg, drafts, mask=rg < G)
    tl.store(packed_ptr + b * (G + 2) + G, final)
    tl.store(packed_ptr + b * (G + 2) + G + 1, acc)
    tl.store(commit_ptr + b, commit.to(tl.int32))
    tl.store(snaps_ptr + b, snap.to(tl.int32))
    tl.store(rows_ptr + b, b * L + tl.maximum(commit - 1, 0))


def accept_greedy(logits: torch.Tensor, drafts: torch.Tensor, keep: torch.Tensor, n: torch.Tensor,
                  snap_n: torch.Tensor):
    """See reference.accept_greedy: one program per block."""
    B, G = drafts.shape
    V = logits.shape[-1]
    L = logits.shape[0] // B
    dev = logits.device
    packed = torch.empty(B, G + 2, dtype=torch.int64, device=dev)
    commit = torch.empty(B, dtype=torch.int32, device=dev)
    snaps = torch.empty(B, dtype=torch.int32, device=dev)
    rows = torch.empty(B, dtype=torch.int64, device=dev)
    use_pdl = pdl(logits)
    if B:
        launch(_accept_kernel, (B,), logits.contiguous(), drafts.contiguous(), keep.contiguous(), n.contiguous(),
               snap_n.contiguous(), packed, commit, snaps, rows, V, G, L=L, LP=triton.next_power_of_2(L),
               GP=triton.next_power_of_2(G), BV=min(ACCEPT_BV, triton.next_power_of_2(V)), PDL=use_pdl,
               launch_pdl=use_pdl, num_warps=8, num_stages=1)
    return packed, commit, snaps, rows
