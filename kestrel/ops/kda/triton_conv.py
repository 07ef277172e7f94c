"""The per-step prologue of the Triton KDA recurrences (see triton.py): the short conv over [cached tail, inputs] +
SiLU, the L2 norms, the gate and beta of every step and head, written out per step (`_kda_prep_kernel`), and the
conv-window helpers the fold's tail programs share."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl_args


@triton.jit
def _tail_part(tail_ptr, t, ch, C, W: tl.constexpr, BW: tl.constexpr):
    """The rows of step t's conv window (rows t .. t + W - 1 of [tail (W - 1 rows), x rows]) that lie in the cached
    tail, as [BW, len(ch)] (zeros elsewhere). The tail was written by an earlier step: it may be read before the
    kernel waits for its predecessor."""
    rw = tl.arange(0, BW)
    idx = t + rw
    on = (rw < W)[:, None] & (ch < C)[None, :]
    return tl.load(tail_ptr + idx[:, None] * C + ch[None, :], mask=on & (idx < W - 1)[:, None], other=0.0)


@triton.jit
def _conv_window(x_ptr, stride_x, wt, t, ch, C, W: tl.constexpr, BW: tl.constexpr):
    """The W conv taps of step t for channels ch: rows t .. t + W - 1 of the window [tail (W - 1 rows), x rows],
    as [BW, len(ch)] (rows past W and channels past C are zero), from the tail part `wt` (_tail_part) and the
    inputs. Step 0 of a decode is the cached tail and the new input."""
    rw = tl.arange(0, BW)
    idx = t + rw
    on = (rw < W)[:, None] & (ch < C)[None, :]
    in_tail = (idx < W - 1)[:, None]
    wx = tl.load(x_ptr + (idx - (W - 1))[:, None] * stride_x + ch[None, :], mask=on & (idx >= W - 1)[:, None],
                 other=0.0)
    return tl.where(in_tail, wt, wx)


@triton.jit
def _conv_weights(w_ptr, ch, W: tl.constexpr, BW: tl.constexpr):
    """The conv taps' weights of channels ch as [BW, len(ch)] (rows past W zero)."""
    rw = tl.arange(0, BW)
    return tl.load(w_ptr + ch[None, :] * W + rw[:, None], mask=rw[:, None] < W, other=0.0)


@triton.jit
def _conv_silu(win, wt, W: tl.constexpr, BW: tl.constexpr, dt: tl.constexpr):
    """Short conv of one window with its weights (_conv_weights) + SiLU, rounded like the reference (taps summed
    in order, in the activation dtype); returns fp32 values of dt numbers."""
    rw = tl.arange(0, BW)
    prod = (win.to(dt).to(tl.float32) * wt.to(tl.float32)).to(dt).to(tl.float32)
    y = tl.sum(tl.where(rw[:, None] == 0, prod, 0.0), 0).to(dt)
    for j in tl.static_range(1, W):
        y = (y.to(tl.float32) + tl.sum(tl.where(rw[:, None] == j, prod, 0.0), 0)).to(dt)
    yf = y.to(tl.float32)
    return (yf * tl.sigmoid(yf)).to(dt).to(tl.float32)


@triton.jit
def _store_tail(tail_ptr, win, ch, C, W: tl.constexpr, BW: tl.constexpr):
    """Window rows 1 .. W - 1 become the tail (call after a barrier: other warps' lanes may still read the old
    tail)."""
    rw = tl.arange(0, BW)
    tl.store(tail_ptr + (rw[:, None] - 1) * C + ch[None, :], win,
             mask=(rw[:, None] >= 1) & (rw[:, None] < W) & (ch < C)[None, :])


@triton.jit
def _l2norm_round(x, eps, dt: tl.constexpr):
    """x over its first axis (a [K] vector or a [K, 1] column) L2-normalised, rounded to dt, as fp32."""
    return (x / tl.sqrt(tl.sum(x * x, 0, keep_dims=True) + eps)).to(dt).to(tl.float32)


@triton.jit
def _gate(raw, dtb, a, lower_bound, SAFE_GATE: tl.constexpr):
    """The fp32 log-decay of one head from its gate-bottleneck row `raw`, dt bias row `dtb` and exp(A_log) `a`
    (see reference.kda_gate)."""
    x = raw.to(tl.float32) + dtb.to(tl.float32)
    if SAFE_GATE:
        return lower_bound * tl.sigmoid(a * x)
    return -a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))


# Per-tap channel columns (`_kda_prep_kernel`'s CF form, conv widths up to 4; wider convs take the window form):
# every per-channel vector is a [channels, 1] column, the conv a sum of W columns in order (no reduction), so
# nothing changes layout. The [taps, channels] window form compiles (k3-mini's shapes, sm_90) to 6 layout
# conversions and 48 barriers after the PDL wait; this one to none and 6. H100, turn about in one run
# (device_run175.sh): k3-mini decode graph 1.449 -> 1.345 ms at batch 1 (1.077x), 1.013x at batch 8; k3-small
# verify + fold graphs 0.958x / 1.021x / 1.075x at 1 / 8 / 64 blocks of 8 (the first within that run's noise).
# The two forms give bit-equal conv tails, v, gates and beta; q and k differ by their L2 norms' reduction order.
CHANNELS_FIRST = True


@triton.jit
def _taps_before(tail, w_ptr, t, ch, C, W: tl.constexpr):
    """What a step's conv reads before the wait, for channel column ch [N, 1]: window rows 0 .. 2 where they lie in
    the cached tail (row t + j < W - 1; zeros elsewhere) and the W <= 4 tap weights (zeros past W)."""
    on = ch < C
    t0 = tl.load(tail + t * C + ch, mask=on & (t < W - 1), other=0.0)
    t1 = tl.load(tail + (t + 1) * C + ch, mask=on & (t + 1 < W - 1), other=0.0)
    t2 = tl.load(tail + (t + 2) * C + ch, mask=on & (t + 2 < W - 1), other=0.0)
    w0 = tl.load(w_ptr + ch * W, mask=on, other=0.0)
    w1 = tl.load(w_ptr + ch * W + 1, mask=on & (W > 1), other=0.0)
    w2 = tl.load(w_ptr + ch * W + 2, mask=on & (W > 2), other=0.0)
    w3 = tl.load(w_ptr + ch * W + 3, mask=on & (W > 3), other=0.0)
    return t0, t1, t2, w0, w1, w2, w3


@triton.jit
def _tap_row(xb, stride_xt, t, j: tl.constexpr, tj, ch, C, W: tl.constexpr):
    """Window row j of step t: the tail's (tj, from _taps_before) or input row t + j - (W - 1)."""
    xj = tl.load(xb + (t + j - (W - 1)) * stride_xt + ch, mask=(ch < C) & (t + j >= W - 1), other=0.0)
    return tl.where(t + j < W - 1, tj, xj)


@triton.jit
def _tap_add(y, win, wj, dt: tl.constexpr):
    """y + win * wj, rounded like the reference (the product, then the sum, in the activation dtype)."""
    prod = (win.to(dt).to(tl.float32) * wj.to(tl.float32)).to(dt).to(tl.float32)
    return (y.to(tl.float32) + prod).to(dt)


@triton.jit
def _conv_taps(xb, stride_xt, t, ch, C, before, W: tl.constexpr, dt: tl.constexpr):
    """Conv + SiLU of step t for channel column ch [N, 1] (before: _taps_before's loads): (fp32 values of dt
    numbers, window rows 1, 2, 3 for the tail)."""
    t0, t1, t2, w0, w1, w2, w3 = before
    r0 = _tap_row(xb, stride_xt, t, 0, t0, ch, C, W)
    y = (r0.to(dt).to(tl.float32) * w0.to(tl.float32)).to(dt)
    r1 = r0
    r2 = r0
    r3 = r0
    if W > 1:
        r1 = _tap_row(xb, stride_xt, t, 1, t1, ch, C, W)
        y = _tap_add(y, r1, w1, dt)
    if W > 2:
        r2 = _tap_row(xb, stride_xt, t, 2, t2, ch, C, W)
        y = _tap_add(y, r2, w2, dt)
    if W > 3:
        r3 = _tap_row(xb, stride_xt, t, 3, t0, ch, C, W)  # (never in the tail: t + 3 >= W - 1)
        y = _tap_add(y, r3, w3, dt)
    yf = y.to(tl.float32)
    return (yf * tl.sigmoid(yf)).to(dt).to(tl.float32), r1, r2, r3


@triton.jit
def _store_taps(tail, rows, ch, C, W: tl.constexpr):
    """Window rows 1 .. W - 1 become the tail rows 0 .. W - 2 (after a barrier, as _store_tail)."""
    r1, r2, r3 = rows
    on = ch < C
    if W > 1:
        tl.store(tail + ch, r1, mask=on)
    if W > 2:
        tl.store(tail + C + ch, r2, mask=on)
    if W > 3:
        tl.store(tail + 2 * C + ch, r3, mask=on)


@triton.jit
def _store_step(q, k, v, raw_ptr, dtb, a, lower_bound, q_ptr, k_ptr, v_ptr, g_ptr, blog_ptr, beta_ptr, bt, h, H,
                stride_blog, rk, rv, K: tl.constexpr, V: tl.constexpr, SAFE_GATE: tl.constexpr,
                BETA_LOGITS: tl.constexpr):
    """A step's outputs for head h: q, k, v, the gate (from the bottleneck row and dt bias `dtb` over channels rk)
    and, with BETA_LOGITS, beta."""
    row = bt * H + h
    g = _gate(tl.load(raw_ptr + row * K + rk), dtb, a, lower_bound, SAFE_GATE)
    tl.store(q_ptr + row * K + rk, q)
    tl.store(k_ptr + row * K + rk, k.to(k_ptr.dtype.element_ty))
    tl.store(v_ptr + row * V + rv, v.to(v_ptr.dtype.element_ty))
    tl.store(g_ptr + row * K + rk, g)
    if BETA_LOGITS:
        tl.store(beta_ptr + row, tl.sigmoid(tl.load(blog_ptr + bt * stride_blog + h).to(tl.float32)))


@triton.jit
def _kda_prep_kernel(x_ptr, w_ptr, conv_ptr, slots_ptr, raw_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr,
                     blog_ptr, beta_ptr, H, stride_xb, stride_xt, stride_conv, stride_blog, lower_bound, scale, L,
                     K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, SAFE_GATE: tl.constexpr,
                     WRITE_TAIL: tl.constexpr, BETA_LOGITS: tl.constexpr, EARLY: tl.constexpr, CF: tl.constexpr,
                     PDL: tl.constexpr):
    """Step t of block b, head h: conv window rows t .. t + W - 1 of [tail, x_b] (x_b's steps stride_xt apart: a
    verify block may be rows of a wider GEMM output), SiLU, L2 norm, gate. Writes q
    (scaled, fp32), k, v (activation dtype) and g (fp32) of the step; WRITE_TAIL (decode, L = 1) shifts the tail;
    BETA_LOGITS: beta = sigmoid(logit) (fp32) of the step and head too. EARLY (see triton.EARLY_STATE): the tail, the
    conv weights and the gate's parameters are read before the wait. CF: see CHANNELS_FIRST."""
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    bt = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    b = bt // L
    t = bt % L
    slot = tl.load(slots_ptr + b).to(tl.int64)
    C = H * (2 * K + V)
    dt = x_ptr.dtype.element_ty
    if CF:
        _prep_cf(x_ptr, w_ptr, conv_ptr, raw_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr, blog_ptr, beta_ptr,
                 H, stride_xb, stride_xt, stride_conv, stride_blog, lower_bound, scale, bt, h, b, t, slot, C, dt, K,
                 V, W, BW, SAFE_GATE, WRITE_TAIL, BETA_LOGITS, EARLY, PDL)
        return
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    qc, kc, vc = h * K + rk, H * K + h * K + rk, 2 * H * K + h * V + rv
    # slot rows may be strided (the unified pool interleaves every layer's state in one block per slot)
    tail = conv_ptr + slot * stride_conv
    # what no kernel of this step writes (the cached tail, from an earlier step; the weights), read first: with
    # EARLY, before waiting for the projections
    qt = _tail_part(tail, t, qc, C, W, BW)
    kt = _tail_part(tail, t, kc, C, W, BW)
    vt = _tail_part(tail, t, vc, C, W, BW)
    qcw, kcw, vcw = _conv_weights(w_ptr, qc, W, BW), _conv_weights(w_ptr, kc, W, BW), _conv_weights(w_ptr, vc, W, BW)
    dtb = tl.load(dtb_ptr + h * K + rk)
    a = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    if PDL:
        if EARLY:
            gdc_wait()
    xb = x_ptr + b * stride_xb
    qw = _conv_window(xb, stride_xt, qt, t, qc, C, W, BW)
    kw = _conv_window(xb, stride_xt, kt, t, kc, C, W, BW)
    vw = _conv_window(xb, stride_xt, vt, t, vc, C, W, BW)
    q = _l2norm_round(_conv_silu(qw, qcw, W, BW, dt), 1e-6, dt) * scale
    k = _l2norm_round(_conv_silu(kw, kcw, W, BW, dt), 1e-6, dt)
    v = _conv_silu(vw, vcw, W, BW, dt)
    _store_step(q, k, v, raw_ptr, dtb, a, lower_bound, q_ptr, k_ptr, v_ptr, g_ptr, blog_ptr, beta_ptr, bt, h, H,
                stride_blog, rk, rv, K, V, SAFE_GATE, BETA_LOGITS)
    if WRITE_TAIL:
        tl.debug_barrier()
        _store_tail(tail, qw, qc, C, W, BW)
        _store_tail(tail, kw, kc, C, W, BW)
        _store_tail(tail, vw, vc, C, W, BW)


@triton.jit
def _prep_cf(x_ptr, w_ptr, conv_ptr, raw_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr, blog_ptr, beta_ptr, H,
             stride_xb, stride_xt, stride_conv, stride_blog, lower_bound, scale, bt, h, b, t, slot, C, dt: tl.constexpr,
             K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, SAFE_GATE: tl.constexpr,
             WRITE_TAIL: tl.constexpr, BETA_LOGITS: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """_kda_prep_kernel's step with per-tap channel columns: the same values, every vector a [K, 1] column."""
    tl.static_assert(W <= 4)
    rk = tl.arange(0, K)[:, None]
    rv = tl.arange(0, V)[:, None]
    qc, kc, vc = h * K + rk, H * K + h * K + rk, 2 * H * K + h * V + rv
    tail = conv_ptr + slot * stride_conv
    qb = _taps_before(tail, w_ptr, t, qc, C, W)
    kb = _taps_before(tail, w_ptr, t, kc, C, W)
    vb = _taps_before(tail, w_ptr, t, vc, C, W)
    dtb = tl.load(dtb_ptr + h * K + rk)
    a = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    if PDL:
        if EARLY:
            gdc_wait()
    xb = x_ptr + b * stride_xb
    q, q1, q2, q3 = _conv_taps(xb, stride_xt, t, qc, C, qb, W, dt)
    k, k1, k2, k3 = _conv_taps(xb, stride_xt, t, kc, C, kb, W, dt)
    v, v1, v2, v3 = _conv_taps(xb, stride_xt, t, vc, C, vb, W, dt)
    q = _l2norm_round(q, 1e-6, dt) * scale
    k = _l2norm_round(k, 1e-6, dt)
    _store_step(q, k, v, raw_ptr, dtb, a, lower_bound, q_ptr, k_ptr, v_ptr, g_ptr, blog_ptr, beta_ptr, bt, h, H,
                stride_blog, rk, rv, K, V, SAFE_GATE, BETA_LOGITS)
    if WRITE_TAIL:
        tl.debug_barrier()
        _store_taps(tail, (q1, q2, q3), qc, C, W)
        _store_taps(tail, (k1, k2, k3), kc, C, W)
        _store_taps(tail, (v1, v2, v3), vc, C, W)


def launch_prep(x, conv_weight, conv_state, slots, raw_gate, A_log, dt_bias, lower_bound, scale, H, K, V,
                write_tail: bool, beta_logits: torch.Tensor | None = None, early: bool = True):
    """_kda_prep_kernel over x [B, L, C]: (q, k, v, g, beta); beta [B, L, H] fp32 from beta_logits ([B * L, H],
    rows may be strided), else None. early: see triton.EARLY_STATE."""
    B, L, C = x.shape
    assert x.stride(2) == 1, "a step's channels must be contiguous"
    q = torch.empty(B, L, H, K, dtype=torch.float32, device=x.device)
    k = torch.empty(B, L, H, K, dtype=x.dtype, device=x.device)
    v = torch.empty(B, L, H, V, dtype=x.dtype, device=x.device)
    g = torch.empty(B, L, H, K, dtype=torch.float32, device=x.device)
    beta = None
    if beta_logits is not None:
        beta_logits = beta_logits.reshape(B * L, H)
        assert beta_logits.stride(-1) == 1
        beta = torch.empty(B, L, H, dtype=torch.float32, device=x.device)
    W = conv_weight.shape[1]
    if B and L:
        _kda_prep_kernel[(B * L, H)](
            x, conv_weight.contiguous(), conv_state, slots, raw_gate.contiguous(), A_log, dt_bias, q, k, v, g,
            beta_logits if beta is not None else g, beta if beta is not None else g, H, x.stride(0), x.stride(1),
            conv_state.stride(0), beta_logits.stride(0) if beta is not None else 0,
            0.0 if lower_bound is None else float(lower_bound), float(scale), L=L, K=K, V=V, W=W,
            BW=triton.next_power_of_2(W), SAFE_GATE=lower_bound is not None, WRITE_TAIL=write_tail,
            BETA_LOGITS=beta is not None, EARLY=early, CF=CHANNELS_FIRST and W <= 4, num_warps=4,
            # no fused multiply-adds: the compiler contracted the conv's rounded bf16 product and sum into one
            # fma.rn.bf16 (the reference rounds the product), and did so differently in decode and verify, whose
            # outputs must be bit-equal (device call 174)
            enable_fp_fusion=False, **pdl_args(x))
    return q, k, v, g, beta
