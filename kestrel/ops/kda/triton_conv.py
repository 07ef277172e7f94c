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
    return (x / tl.sqrt(tl.sum(x * x, 0) + eps)).to(dt).to(tl.float32)


@triton.jit
def _gate(raw, dtb, a, lower_bound, SAFE_GATE: tl.constexpr):
    """The fp32 log-decay of one head from its gate-bottleneck row `raw`, dt bias row `dtb` and exp(A_log) `a`
    (see reference.kda_gate)."""
    x = raw.to(tl.float32) + dtb.to(tl.float32)
    if SAFE_GATE:
        return lower_bound * tl.sigmoid(a * x)
    return -a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _kda_prep_kernel(x_ptr, w_ptr, conv_ptr, slots_ptr, raw_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr,
                     blog_ptr, beta_ptr, H, stride_xb, stride_xt, stride_conv, stride_blog, lower_bound, scale, L,
                     K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, SAFE_GATE: tl.constexpr,
                     WRITE_TAIL: tl.constexpr, BETA_LOGITS: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """Step t of block b, head h: conv window rows t .. t + W - 1 of [tail, x_b] (x_b's steps stride_xt apart: a
    verify block may be rows of a wider GEMM output), SiLU, L2 norm, gate. Writes q
    (scaled, fp32), k, v (activation dtype) and g (fp32) of the step; WRITE_TAIL (decode, L = 1) shifts the tail;
    BETA_LOGITS: beta = sigmoid(logit) (fp32) of the step and head too. EARLY (see triton.EARLY_STATE): the tail, the
    conv weights and the gate's parameters are read before the wait."""
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
    row = bt * H + h
    g = _gate(tl.load(raw_ptr + row * K + rk), dtb, a, lower_bound, SAFE_GATE)
    tl.store(q_ptr + row * K + rk, q)
    tl.store(k_ptr + row * K + rk, k.to(k_ptr.dtype.element_ty))
    tl.store(v_ptr + row * V + rv, v.to(v_ptr.dtype.element_ty))
    tl.store(g_ptr + row * K + rk, g)
    if BETA_LOGITS:
        tl.store(beta_ptr + row, tl.sigmoid(tl.load(blog_ptr + bt * stride_blog + h).to(tl.float32)))
    if WRITE_TAIL:
        tl.debug_barrier()
        _store_tail(tail, qw, qc, C, W, BW)
        _store_tail(tail, kw, kc, C, W, BW)
        _store_tail(tail, vw, vc, C, W, BW)


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
            BETA_LOGITS=beta is not None, EARLY=early, num_warps=4, **pdl_args(x))
    return q, k, v, g, beta
