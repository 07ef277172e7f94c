"""Triton KDA kernels: the fused decode step and the chunked (WY) prefill.

Decode: one program per (sequence, head) does the conv-tail update, SiLU, L2 norm, gate, beta and the delta-rule
recurrence on the state slot in place, in one launch. It rounds where the reference rounds (the short conv runs
in the activation dtype, q and k are cast back after the L2 norm) so decode and prefill agree closely.
Chunked prefill lives in triton_chunk.py.
"""

import torch
import triton
import triton.language as tl

from kestrel.ops.kda.triton_chunk import kda_chunked  # noqa: F401


@triton.jit
def _conv_silu(mixed_ptr, w_ptr, tail_ptr, ch, C, W: tl.constexpr, BW: tl.constexpr):
    """Short conv over the window [tail (W-1 taps), x] for channels ch, rounded like the reference.

    Returns (SiLU output in fp32, the window [BW, len(ch)]); the caller writes window rows 1.. back as the new tail
    after a barrier: replicated lanes of other warps may still be reading the old tail.
    """
    rw = tl.arange(0, BW)
    x = tl.load(mixed_ptr + ch)
    dt = x.dtype
    win = tl.load(tail_ptr + rw[:, None] * C + ch[None, :], mask=rw[:, None] < W - 1, other=0.0)
    win = tl.where(rw[:, None] == W - 1, x[None, :], win)
    wt = tl.load(w_ptr + ch[None, :] * W + rw[:, None], mask=rw[:, None] < W, other=0.0)
    prod = (win.to(tl.float32) * wt.to(tl.float32)).to(dt).to(tl.float32)
    y = tl.sum(tl.where(rw[:, None] == 0, prod, 0.0), 0).to(dt)
    for j in tl.static_range(1, W):
        y = (y.to(tl.float32) + tl.sum(tl.where(rw[:, None] == j, prod, 0.0), 0)).to(dt)
    yf = y.to(tl.float32)
    return (yf * tl.sigmoid(yf)).to(dt).to(tl.float32), win


@triton.jit
def _store_tail(tail_ptr, win, ch, C, W: tl.constexpr, BW: tl.constexpr):
    rw = tl.arange(0, BW)
    tl.store(tail_ptr + (rw[:, None] - 1) * C + ch[None, :], win, mask=(rw[:, None] >= 1) & (rw[:, None] < W))


@triton.jit
def _l2norm_round(x, eps, dt: tl.constexpr):
    return (x / tl.sqrt(tl.sum(x * x, 0) + eps)).to(dt).to(tl.float32)


@triton.jit
def _kda_decode_kernel(mixed_ptr, w_ptr, conv_ptr, ssm_ptr, slots_ptr, raw_ptr, alog_ptr, dtb_ptr, beta_ptr, o_ptr,
                       H, stride_m, stride_conv, stride_ssm, lower_bound, scale,
                       K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr,
                       SAFE_GATE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    C = H * (2 * K + V)
    dt = mixed_ptr.dtype.element_ty
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    mrow = mixed_ptr + b * stride_m
    # slot rows may be strided (the unified pool interleaves every layer's state in one block per slot)
    tail = conv_ptr + slot * stride_conv
    q, qw = _conv_silu(mrow, w_ptr, tail, h * K + rk, C, W, BW)
    k, kw = _conv_silu(mrow, w_ptr, tail, H * K + h * K + rk, C, W, BW)
    v, vw = _conv_silu(mrow, w_ptr, tail, 2 * H * K + h * V + rv, C, W, BW)
    tl.debug_barrier()
    _store_tail(tail, qw, h * K + rk, C, W, BW)
    _store_tail(tail, kw, H * K + h * K + rk, C, W, BW)
    _store_tail(tail, vw, 2 * H * K + h * V + rv, C, W, BW)
    q = _l2norm_round(q, 1e-6, dt) * scale
    k = _l2norm_round(k, 1e-6, dt)
    # gate in fp32 from the bottleneck output
    x = tl.load(raw_ptr + (b * H + h) * K + rk).to(tl.float32) + tl.load(dtb_ptr + h * K + rk).to(tl.float32)
    a = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    if SAFE_GATE:
        g = lower_bound * tl.sigmoid(a * x)
    else:
        g = -a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    beta = tl.load(beta_ptr + b * H + h).to(tl.float32)
    sp = ssm_ptr + slot * stride_ssm + h * K * V + rk[:, None] * V + rv[None, :]
    S = tl.load(sp) * tl.exp(g)[:, None]
    u = v - tl.sum(S * k[:, None], 0)
    S = S + (beta * k)[:, None] * u[None, :]
    tl.store(sp, S)
    o = tl.sum(S * q[:, None], 0)
    tl.store(o_ptr + (b * H + h) * V + rv, o.to(o_ptr.dtype.element_ty))


def kda_decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale):
    """See kestrel.ops.kda.decode. fp64 inputs go to the reference."""
    if mixed.dtype == torch.float64:
        from kestrel.ops.kda.reference import kda_decode as ref
        return ref(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale)
    B = mixed.shape[0]
    H, K, V = ssm.shape[1:]
    W = conv_weight.shape[1]
    assert conv_state[0].is_contiguous() and ssm[0].is_contiguous() and ssm.dtype == torch.float32
    assert mixed.shape[1] == H * (2 * K + V) == conv_state.shape[2], "mixed / conv_state channel mismatch"
    o = torch.empty(B, H, V, dtype=mixed.dtype, device=mixed.device)
    if mixed.stride(-1) != 1:
        mixed = mixed.contiguous()
    if B:
        _kda_decode_kernel[(B, H)](
            mixed, conv_weight.contiguous(), conv_state, ssm, slots, raw_gate.contiguous(), A_log, dt_bias,
            beta.contiguous(), o, H, mixed.stride(0), conv_state.stride(0), ssm.stride(0),
            0.0 if lower_bound is None else float(lower_bound), float(scale),
            K=K, V=V, W=W, BW=triton.next_power_of_2(W), SAFE_GATE=lower_bound is not None, num_warps=8 if K * V >= 128 * 128 else 4)
    return o
