"""Triton kernels of the DSpark drafter (see reference.py): the block's front and attention, the sequential
correction, the vocabulary projection's argmax keys, their decode and the first confidence; one program per row and
tile of outputs. The step's kernels around the drafter are in step_triton.py. Under programmatic dependent launch each program loads its weight tile before it waits for the previous
kernel (the weights are parameters: no kernel in flight writes them)."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl, pdl_args
from kestrel.ops.triton_utils import launch, pdl_prologue

MIN_KEY = tl.constexpr(-9223372036854775808)  # below every key
# the largest weight tile (elements) a program holds
TILE = 8192


@triton.jit
def _low():
    return tl.full([], 0xFFFFFFFF, tl.int64)


@triton.jit
def _tile(w_ptr, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr, LATE: tl.constexpr):
    """(rows, cols, the [BN, KP] tile of a row-major [N, K] weight at program_id(0)), loaded before any wait (a
    parameter: no kernel in flight writes it); under PDL the dependents may launch first unless LATE (then the
    caller lets them launch after its wait)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, KP)
    if PDL and not LATE:
        gdc_launch_dependents()
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < K),
                other=0.0)
    return rows, cols, w


@triton.jit
def _wait(PDL: tl.constexpr, LATE: tl.constexpr):
    """Under PDL, wait for the previous kernel; with LATE, then let the dependents launch (so everything before
    this kernel has finished when they start: they may read it before their own wait)."""
    if PDL:
        gdc_wait()
        if LATE:
            gdc_launch_dependents()


@triton.jit
def _tile_then_wait(w_ptr, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """_tile, then the wait for the previous kernel (the dependents launch before both)."""
    rows, cols, w = _tile(w_ptr, N, K, KP, BN, PDL, False)
    _wait(PDL, False)
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
                       KEYS: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """EARLY: the slot's and the state's part of the product before the wait (the previous kernel launched this
    one after its own wait, so the kernels that wrote them have finished); only the token's part after it."""
    b = tl.program_id(1).to(tl.int64)
    K: tl.constexpr = 2 * D + T
    rows, cols, w = _tile(w_ptr, C, K, KP, BN, PDL, False)
    if EARLY:
        u = _rms_piece(slot_ptr + b * D, cols, 0, D, eps)
        u += _rms_piece(state_ptr + b * D, cols, D, D, eps)
        part = tl.sum(w.to(tl.float32) * u[None, :], 1)
    _wait(PDL, False)
    if KEYS:  # the previous position's partial argmax keys: the best of them
        rp = tl.arange(0, PP)
        keys = tl.load(prev_ptr + b * P + rp, mask=rp < P, other=MIN_KEY)
        tok = _low() - (tl.max(keys, 0) & _low())
    else:
        tok = tl.load(prev_ptr + b)
    if EARLY:
        acc = part + tl.sum(w.to(tl.float32) * _rms_piece(emb_ptr + tok * T, cols, 2 * D, T, eps)[None, :], 1)
    else:
        u = _rms_piece(slot_ptr + b * D, cols, 0, D, eps)
        u += _rms_piece(state_ptr + b * D, cols, D, D, eps)
        u += _rms_piece(emb_ptr + tok * T, cols, 2 * D, T, eps)
        acc = tl.sum(w.to(tl.float32) * u[None, :], 1)
    a = acc.to(y_ptr.dtype.element_ty).to(tl.float32)  # the projection's output, then torch's silu on it
    tl.store(y_ptr + b * C + rows, (a * tl.sigmoid(a)).to(y_ptr.dtype.element_ty), mask=rows < C)


def correct_up(slot: torch.Tensor, state: torch.Tensor, prev: torch.Tensor, emb: torch.Tensor, w_up: torch.Tensor,
               eps: float, early: bool = False) -> torch.Tensor:
    """See reference.correct_up (fp64 goes to the reference). early: under PDL, the slot's and the state's part
    before the wait: only where the previous kernel launched this one late (head_keys' late_trigger) and nothing
    since the kernels that wrote slot and state has written them (the same sums, in another order)."""
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
               KP=KP, BN=BN, PP=triton.next_power_of_2(P), KEYS=prev.dim() == 2, EARLY=early, PDL=use_pdl,
               launch_pdl=use_pdl, num_warps=4, num_stages=1)
    return y


@triton.jit
def _head_keys_kernel(h_ptr, w_ptr, keys_ptr, stats_ptr, N, NB, eps, K: tl.constexpr, KP: tl.constexpr,
                      BN: tl.constexpr, STATS: tl.constexpr, NORM: tl.constexpr, LATE: tl.constexpr,
                      PDL: tl.constexpr):
    nb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows, cols, w = _tile(w_ptr, N, K, KP, BN, PDL, LATE)
    _wait(PDL, LATE)
    if NORM:  # every program normalises the row itself (K values): the head then needs no kernel of its own
        hf = _rms_piece(h_ptr + b * K, cols, 0, K, eps)
    else:
        hf = tl.load(h_ptr + b * K + cols, mask=cols < K, other=0.0).to(tl.float32)
    logit = tl.sum(w.to(tl.float32) * hf[None, :], 1).to(w.dtype).to(tl.float32)  # as the output rounds
    bits = (logit + 0.0).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (_low() - rows.to(tl.int64))
    key = tl.where(rows < N, key, MIN_KEY)
    tl.store(keys_ptr + b * NB + nb, tl.max(key, 0))
    if STATS:  # the tile's largest two logits and sum of exp(logit - largest): reference.head_stats per tile
        x = tl.where(rows < N, logit, float("-inf"))
        m1 = tl.max(x, 0)
        first = tl.min(tl.where(x == m1, rows, N + BN), 0)
        m2 = tl.max(tl.where(rows == first, float("-inf"), x), 0)
        out = stats_ptr + (b * NB + nb) * 3
        tl.store(out, m1)
        tl.store(out + 1, m2)
        tl.store(out + 2, tl.sum(tl.exp(x - m1), 0))


def head_keys(h: torch.Tensor, w: torch.Tensor, stats: bool = False, eps: float | None = None,
              late_trigger: bool = False):
    """See reference.head_keys: here one key (and with stats, one [3] summary) per program's tile of the
    vocabulary, [B, P] (and [B, P, 3]) (fp64 goes to the reference). late_trigger: under PDL, the next kernel
    launches only once this one has waited (see correct_up's early)."""
    if h.dtype == torch.float64:
        from kestrel.ops.dspark.reference import head_keys as ref
        return ref(h, w, stats, eps)
    B, K = h.shape
    N = w.shape[0]
    assert w.shape[1] == K and w.is_contiguous() and w.dtype == h.dtype
    h = h.contiguous()
    KP = triton.next_power_of_2(K)
    BN = max(1, min(64, TILE // KP))
    NB = triton.cdiv(N, BN)
    keys = torch.empty(B, NB, dtype=torch.int64, device=h.device)
    summary = torch.empty(B, NB, 3, dtype=torch.float32, device=h.device) if stats else keys
    use_pdl = pdl(h)
    if B:
        launch(_head_keys_kernel, (NB, B), h, w, keys, summary, N, NB, 0.0 if eps is None else eps, K=K, KP=KP,
               BN=BN, STATS=stats, NORM=eps is not None, LATE=late_trigger, PDL=use_pdl, launch_pdl=use_pdl,
               num_warps=4, num_stages=1)
    return (keys, summary) if stats else keys


@triton.jit
def _decode_keys_kernel(keys, out_ptr, P, stats_ptr, state_ptr, wu_ptr, bu_ptr, wd_ptr, bd_ptr, conf_ptr, SP, eps,
                        G: tl.constexpr, PP: tl.constexpr, CONF: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
                        KP: tl.constexpr, CP: tl.constexpr, SPP: tl.constexpr, PDL: tl.constexpr):
    """Every drafted position's token from its partial keys; with CONF also the first position's confidence (the
    confidence kernel's work, its parameters loaded before the wait)."""
    b = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_launch_dependents()
    if CONF:
        wu, bu, wd, bd = _confidence_weights(wu_ptr, bu_ptr, wd_ptr, bd_ptr, D, C, KP, CP)
    if PDL:
        gdc_wait()
    rp = tl.arange(0, PP)
    for i in tl.static_range(G):
        k = tl.load(keys[i] + b * P + rp, mask=rp < P, other=MIN_KEY)
        tl.store(out_ptr + b * G + i, _low() - (tl.max(k, 0) & _low()))
    if CONF:
        _confidence_row(b, stats_ptr, state_ptr, wu, bu, wd, bd, conf_ptr, SP, eps, D, C, KP, CP, SPP)


def decode_keys(keys: list[torch.Tensor], confidence=None):
    """See reference.decode_keys: one program a row reads every position's keys (one launch, where the stack and
    the decode's reduction and arithmetic took four); given the first position's confidence inputs (stats, state,
    up, down, eps), the same launch also computes that confidence (first_confidence's kernel, one boundary fewer on
    the drafting chain) and (tokens, confidence) is returned."""
    B, P = keys[0].shape
    if any(k.shape != (B, P) or k.dtype != torch.int64 or not k.is_contiguous() for k in keys):
        from kestrel.ops.dspark.reference import decode_keys as ref
        return ref(keys, confidence)
    if confidence is not None and not _confidence_ok(*confidence):
        from kestrel.ops.dspark.reference import first_confidence as ref
        return decode_keys(keys), ref(*confidence)
    out = torch.empty(B, len(keys), dtype=torch.int64, device=keys[0].device)
    use_pdl = pdl(keys[0])
    if confidence is None:
        if B:
            launch(_decode_keys_kernel, (B,), tuple(keys), out, P, out, out, out, out, out, out, out, 0, 0.0,
                   G=len(keys), PP=triton.next_power_of_2(P), CONF=False, D=1, C=1, KP=1, CP=1, SPP=1, PDL=use_pdl,
                   launch_pdl=use_pdl, num_warps=1, num_stages=1)
        return out
    stats, state, up, down, eps = confidence
    D, C, SP = state.shape[1], up.weight.shape[0], stats.shape[1]
    conf = torch.empty(B, 1, dtype=torch.float32, device=state.device)
    if B:
        launch(_decode_keys_kernel, (B,), tuple(keys), out, P, stats.contiguous(), state.contiguous(), up.weight,
               up.bias, down.weight.contiguous(), down.bias, conf, SP, eps, G=len(keys), PP=triton.next_power_of_2(P),
               CONF=True, D=D, C=C, KP=triton.next_power_of_2(D + 2), CP=triton.next_power_of_2(C),
               SPP=triton.next_power_of_2(SP), PDL=use_pdl, launch_pdl=use_pdl, num_warps=8, num_stages=1)
    return out, conf


@triton.jit
def _block_front_kernel(f_ptr, tok_ptr, emb_ptr, fn_ptr, tn_ptr, w_ptr, slots_ptr, x_ptr, D, FS, eps,
                        G: tl.constexpr, L: tl.constexpr, T: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr,
                        PDL: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    K: tl.constexpr = (L + 1) * T
    rows, cols, w = _tile_then_wait(w_ptr, D, K, KP, BN, PDL)
    dt = x_ptr.dtype.element_ty
    u = tl.zeros([KP], tl.float32)
    for l in tl.static_range(L):  # each feature layer normalised alone, then its norm's weight (torch's roundings)
        on = (cols >= l * T) & (cols < (l + 1) * T)
        piece = _rms_piece(f_ptr + b * FS + l * T, cols, l * T, T, eps)
        nw = tl.load(fn_ptr + l * T + (cols - l * T), mask=on, other=0.0).to(tl.float32)
        u += (piece * nw).to(dt).to(tl.float32)
    tok = tl.load(tok_ptr + b).to(tl.int64)
    on = cols >= L * T
    piece = _rms_piece(emb_ptr + tok * T, cols, L * T, T, eps)
    nw = tl.load(tn_ptr + (cols - L * T), mask=on & (cols < K), other=0.0).to(tl.float32)
    u += (piece * nw).to(dt).to(tl.float32)
    ctx = tl.sum(w.to(tl.float32) * u[None, :], 1).to(dt)
    out = x_ptr + b * (G + 1) * D + rows
    keep = rows < D
    tl.store(out, ctx, mask=keep)
    cf = ctx.to(tl.float32)
    for i in tl.static_range(G):  # the slots: ctx + slot, rounded as torch's add
        s = tl.load(slots_ptr + i * D + rows, mask=keep, other=0.0).to(tl.float32)
        tl.store(out + (i + 1) * D, (cf + s).to(dt), mask=keep)


@triton.jit
def _block_attention_kernel(qkv_ptr, o_ptr, S, D, HD, stride_qkv, scale, SP: tl.constexpr, HP: tl.constexpr,
                            PDL: tl.constexpr):
    """One program per (request, head): the whole [S, S] causal score tile in registers, fp32 throughout."""
    pdl_prologue(PDL)
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    rs = tl.arange(0, SP)
    rd = tl.arange(0, HP)
    on = (rs[:, None] < S) & (rd[None, :] < HD)
    at = qkv_ptr + (n * S + rs[:, None]) * stride_qkv + h * HD + rd[None, :]
    q = tl.load(at, mask=on, other=0.0).to(tl.float32)
    k = tl.load(at + D, mask=on, other=0.0).to(tl.float32)
    v = tl.load(at + 2 * D, mask=on, other=0.0).to(tl.float32)
    s = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale  # [query, key]
    s = tl.where((rs[None, :] <= rs[:, None]) & (rs[None, :] < S), s, -float("inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    o = tl.sum(p[:, :, None] * v[None, :, :], 1)  # [query, head dim]
    tl.store(o_ptr + (n * S + rs[:, None]) * D + h * HD + rd[None, :], o.to(o_ptr.dtype.element_ty), mask=on)


# the largest [S, S, head dim] product (padded to powers of two) the attention kernel holds; larger blocks: torch
ATTENTION_MAX = 32768


def block_attention(qkv: torch.Tensor, heads: int, S: int) -> torch.Tensor:
    """See reference.block_attention: one program per request and head, launched under PDL (cuDNN's attention is
    a plain launch with a memset before it, which breaks the step's chain of dependent launches twice a step)."""
    T, D = qkv.shape[0], qkv.shape[1] // 3
    HD = D // heads
    SP, HP = triton.next_power_of_2(S), triton.next_power_of_2(HD)
    if qkv.stride(1) != 1 or SP * SP * HP > ATTENTION_MAX or qkv.dtype == torch.float64:
        from kestrel.ops.dspark.reference import block_attention as ref
        return ref(qkv, heads, S)
    o = torch.empty(T, D, dtype=qkv.dtype, device=qkv.device)
    if T:
        launch(_block_attention_kernel, (T // S, heads), qkv, o, S, D, HD, qkv.stride(0), HD ** -0.5, SP=SP, HP=HP,
               num_warps=4, num_stages=1, **pdl_args(qkv))
    return o


def block_front(features: torch.Tensor, last_token: torch.Tensor, emb: torch.Tensor, feature_norm: torch.Tensor,
                token_norm: torch.Tensor, fc: torch.Tensor, slots: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.block_front: one program per row and tile of fc's outputs, each normalising the row's inputs
    itself (one launch, where the norms, the embedding lookup, the concatenations, the product and the slots' add
    took seven)."""
    N = features.shape[0]
    L, T = feature_norm.shape
    D, K = fc.shape
    dt = fc.dtype
    if (features.dtype != dt or any(t.dtype != dt or not t.is_contiguous() for t in (emb, feature_norm, token_norm,
                                                                                    fc, slots))
            or K != (L + 1) * T or emb.shape[1] != T or features.shape[1] != L * T or features.stride(1) != 1
            or slots.shape[1] != D):
        from kestrel.ops.dspark.reference import block_front as ref
        return ref(features, last_token, emb, feature_norm, token_norm, fc, slots, eps)
    G = slots.shape[0]
    x = torch.empty(N, G + 1, D, dtype=dt, device=features.device)
    KP = triton.next_power_of_2(K)
    BN = max(1, min(16, TILE // KP))
    use_pdl = pdl(features)
    if N:
        launch(_block_front_kernel, (triton.cdiv(D, BN), N), features, last_token.contiguous(), emb, feature_norm,
               token_norm, fc, slots, x, D, features.stride(0), eps, G=G, L=L, T=T, KP=KP, BN=BN, PDL=use_pdl,
               launch_pdl=use_pdl, num_warps=4, num_stages=1)
    return x


@triton.jit
def _confidence_weights(wu_ptr, bu_ptr, wd_ptr, bd_ptr, D: tl.constexpr, C: tl.constexpr, KP: tl.constexpr,
                        CP: tl.constexpr):
    """The confidence head's parameters (loaded before a PDL wait: no kernel in flight writes them)."""
    K: tl.constexpr = D + 2
    rc = tl.arange(0, CP)
    rk = tl.arange(0, KP)
    wu = tl.load(wu_ptr + rc[:, None] * K + rk[None, :], mask=(rc[:, None] < C) & (rk[None, :] < K), other=0.0)
    bu = tl.load(bu_ptr + rc, mask=rc < C, other=0.0).to(tl.float32)
    wd = tl.load(wd_ptr + rc, mask=rc < C, other=0.0).to(tl.float32)
    bd = tl.load(bd_ptr).to(tl.float32)
    return wu, bu, wd, bd


@triton.jit
def _confidence_row(b, stats_ptr, state_ptr, wu, bu, wd, bd, out_ptr, P, eps, D: tl.constexpr, C: tl.constexpr,
                    KP: tl.constexpr, CP: tl.constexpr, PP: tl.constexpr):
    """Row b's first-position confidence from its head stats and state (reference.first_confidence)."""
    rc = tl.arange(0, CP)
    rk = tl.arange(0, KP)
    # the peak (reference.peak): the largest two of the tiles' largest two, logsumexp from the tiles' sums
    rp = tl.arange(0, PP)
    on = rp < P
    base = stats_ptr + (b * P + rp) * 3
    m1 = tl.load(base, mask=on, other=float("-inf"))
    m2 = tl.load(base + 1, mask=on, other=float("-inf"))
    s = tl.load(base + 2, mask=on, other=0.0)
    top1 = tl.max(m1, 0)
    first = tl.min(tl.where(m1 == top1, rp, PP), 0)
    top2 = tl.maximum(tl.max(tl.where(rp == first, float("-inf"), m1), 0),
                      tl.max(tl.where(rp == first, m2, float("-inf")), 0))
    lse = top1 + tl.log(tl.sum(tl.where(on, s * tl.exp(m1 - top1), 0.0), 0))
    # [rms(state), peak] rounded to the state's dtype, then the two-layer head, each output rounded as torch's
    dt = state_ptr.dtype.element_ty
    x = tl.load(state_ptr + b * D + rk, mask=rk < D, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / D + eps)
    u = tl.where(rk < D, (x * r).to(dt).to(tl.float32), 0.0)
    u = tl.where(rk == D, (top1 - lse).to(dt).to(tl.float32), u)
    u = tl.where(rk == D + 1, (top2 - lse).to(dt).to(tl.float32), u)
    a = (tl.sum(wu.to(tl.float32) * u[None, :], 1) + bu).to(dt).to(tl.float32)
    a = tl.where(rc < C, (a * tl.sigmoid(a)).to(dt).to(tl.float32), 0.0)
    z = (tl.sum(wd * a, 0) + bd).to(dt).to(tl.float32)
    tl.store(out_ptr + b, tl.sigmoid(z))


@triton.jit
def _confidence_kernel(stats_ptr, state_ptr, wu_ptr, bu_ptr, wd_ptr, bd_ptr, out_ptr, P, eps, D: tl.constexpr,
                       C: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr, PP: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if PDL:  # the head's weights before the wait (parameters)
        gdc_launch_dependents()
    wu, bu, wd, bd = _confidence_weights(wu_ptr, bu_ptr, wd_ptr, bd_ptr, D, C, KP, CP)
    if PDL:
        gdc_wait()
    _confidence_row(b, stats_ptr, state_ptr, wu, bu, wd, bd, out_ptr, P, eps, D, C, KP, CP, PP)


def _confidence_ok(stats: torch.Tensor, state: torch.Tensor, up, down, eps: float) -> bool:
    """Whether the confidence kernels serve these inputs (fp64, or a head without biases, goes to the reference)."""
    if state.dtype == torch.float64 or up.bias is None or down.bias is None:
        return False
    D, C = state.shape[1], up.weight.shape[0]
    assert up.weight.shape[1] == D + 2 and down.weight.shape == (1, C) and up.weight.is_contiguous()
    return True


def first_confidence(stats: torch.Tensor, state: torch.Tensor, up, down, eps: float) -> torch.Tensor:
    """See reference.first_confidence: one program per row."""
    if not _confidence_ok(stats, state, up, down, eps):
        from kestrel.ops.dspark.reference import first_confidence as ref
        return ref(stats, state, up, down, eps)
    B, D = state.shape
    C = up.weight.shape[0]
    P = stats.shape[1]
    out = torch.empty(B, 1, dtype=torch.float32, device=state.device)
    use_pdl = pdl(state)
    if B:
        launch(_confidence_kernel, (B,), stats.contiguous(), state.contiguous(), up.weight, up.bias,
               down.weight.contiguous(), down.bias, out, P, eps, D=D, C=C, KP=triton.next_power_of_2(D + 2),
               CP=triton.next_power_of_2(C), PP=triton.next_power_of_2(P), PDL=use_pdl, launch_pdl=use_pdl,
               num_warps=8, num_stages=1)
    return out
