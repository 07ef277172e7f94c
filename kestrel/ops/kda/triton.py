"""Triton KDA kernels: decode, speculative verify and the ReplaySSM fold (two shared kernels), and the chunked (WY)
prefill (triton_chunk.py).

Every recurrent path is the same two launches:
- `_kda_prep_kernel` (triton_conv.py), one program per (sequence, step, head): short conv over [cached tail,
  inputs] + SiLU, L2 norm, gate and the scaled query, written out per step (k, v, g are exactly what ReplaySSM
  keeps). Decode (one step) also shifts the conv tail; verify reads the tail and writes nothing of the committed
  state.
- `_kda_recur_kernel`, one program per (sequence, head, V block): the delta-rule recurrence over the stored steps,
  from the state slot. Decode runs it on one step and writes the state; verify runs the block's steps without
  writing the state (outputs only); the fold runs the accepted steps from the stored inputs and writes the state.
Because decode and the fold run the same recurrence kernel on the same stored inputs, a folded state is
bit-identical to the decoded one by construction. Rounding follows the reference (the conv in the activation
dtype, q and k cast back after the L2 norm).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl_args
from kestrel.ops.triton_utils import pdl_prologue

from kestrel.ops.kda.triton_chunk import kda_chunked  # noqa: F401
from kestrel.ops.kda.triton_conv import _conv_window, _store_tail, _tail_part, launch_prep

# V columns per recurrence program (more programs in flight at small batch)
RECUR_BV = 32
# warps per recurrence program. Decode, verify and fold must launch the same tile with the same warps (a sum's order
# follows the layout), so that a folded state stays bit-identical to the decoded one: one setting for all three.
# Fewer warps (no shared-memory round in the step's two sums) measured slower on the H200 (2026-12-04): the
# speculative step graph 0.942x with 2, 0.903x with 1; k3-small and k3-mini decode graphs within 1.5%.
RECUR_WARPS = 4
# the recurrence over a block's steps (verify, fold) unrolled, each step's inputs loaded while the step before it
# runs (off: a loop loading each step's inputs when it starts: an L2 round trip on the chain per step), for key
# heads up to RECUR_PREFETCH_MAX_K wide. H200, verify + fold graphs of 8-token blocks (2026-12-03): head dim 64
# (k3-small) 1.061x / 1.019x / 1.030x at 1 / 8 / 64 blocks; head dim 128 (k3-mini) 0.990x / 1.000x / 0.987x.
# Decode (one step) compiles to the same code either way.
RECUR_PREFETCH = True
RECUR_PREFETCH_MAX_K = 64
# a verify's recurrence sums step t's output with step t + 1's delta-rule sum in one two-operand reduction (one
# cross-warp round a step, not two); each sum as it was, so decode, verify and fold stay bit-identical (the GPU
# tests passed with it, 2026-12-04). H200, k3-small + drafter, batch 1, the greedy step graph: 0.2621 -> 0.2591 ms.
RECUR_PAIRED_SUMS = True

# The recurrent state and the conv tail a step starts from were written by an earlier step (its decode, or its fold
# in a speculative step), behind at least one plain launch or graph boundary: the prep and recurrence kernels read
# them, and their weights, before waiting for the kernel before them (off: after; the decode ladder's "before"
# stage). A fold inside the same speculative step writes the state only after this step's verify has read it.
EARLY_STATE = True


@triton.jit
def _sum_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _delta_update(S, k, v, g, beta):
    """The state half of one recurrence step. Decode, verify and fold all run exactly this on the same [K, V]
    tile shape, so a folded state is bit-identical to the decoded one."""
    S = S * tl.exp(g)[:, None]
    u = v - tl.sum(S * k[:, None], 0)
    return S + (beta * k)[:, None] * u[None, :]


@triton.jit
def _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, rk, rv, K: tl.constexpr, V: tl.constexpr,
                 HAS_OUT: tl.constexpr):
    """One stored step's recurrence inputs (q only with HAS_OUT) as the recurrence reads them."""
    k = tl.load(k_ptr + row * K + rk).to(tl.float32)
    v = tl.load(v_ptr + row * V + rv).to(tl.float32)
    g = tl.load(g_ptr + row * K + rk)
    beta = tl.load(beta_ptr + row).to(tl.float32)
    q = k
    if HAS_OUT:
        q = tl.load(q_ptr + row * K + rk)
    return q, k, v, g, beta


@triton.jit
def _kda_recur_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, ssm_ptr, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr,
                      H, stride_ssm, x_ptr, conv_ptr, stride_xb, stride_xt, stride_conv, NVB, TAILS,
                      L: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                      ALL_STEPS: tl.constexpr, HAS_OUT: tl.constexpr, WRITE_STATE: tl.constexpr,
                      HAS_SNAP: tl.constexpr, EARLY: tl.constexpr, PREFETCH: tl.constexpr, TAIL: tl.constexpr,
                      W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr,
                      PAIRED: tl.constexpr = False, og_ptr=None, sg_ptr=None, stride_og=0,
                      GATES: tl.constexpr = False):
    """The recurrence of block b, head h, columns [vb * BV, (vb + 1) * BV) over its first n[b] stored steps (all L
    with ALL_STEPS), from its state slot. HAS_OUT writes o per step (zeros for the steps past n[b]); WRITE_STATE
    writes the state back; HAS_SNAP also stores the state after snap_n[b] steps into slot snap_slot[b]. EARLY (see
    EARLY_STATE): the state is read before the wait. PREFETCH (see RECUR_PREFETCH): the steps unrolled, each step's
    inputs loaded before the step before it runs (steps past n[b] are loaded too: a block's record holds real
    inputs there). TAIL (the fold): programs vb >= NVB do the fold's conv tails instead (_fold_tail: channel block
    h * TAILS + vb - NVB), beside the recurrence in the same launch (they touch none of its data). GATES (decode):
    program vb = NVB of block b, head h writes the output norm's gate sigmoid(og[b, h]) (_out_gate) instead."""
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    if TAIL:
        if vb >= NVB:
            if PDL:
                if EARLY:
                    gdc_wait()
            _fold_tail(b, h * TAILS + vb - NVB, x_ptr, conv_ptr, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr, H,
                       stride_xb, stride_xt, stride_conv, K, V, W, BW, BC, HAS_SNAP)
        else:
            _recur_body(b, h, vb, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, ssm_ptr, slots_ptr, n_ptr, snap_n_ptr,
                        snap_slot_ptr, H, stride_ssm, L, K, V, BV, ALL_STEPS, HAS_OUT, WRITE_STATE, HAS_SNAP, EARLY,
                        PREFETCH, PDL, PAIRED)
    elif GATES:
        if vb >= NVB:
            if PDL:
                if EARLY:
                    gdc_wait()
            _out_gate(b, h, og_ptr, sg_ptr, stride_og, H, V)
        else:
            _recur_body(b, h, vb, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, ssm_ptr, slots_ptr, n_ptr,
                        snap_n_ptr, snap_slot_ptr, H, stride_ssm, L, K, V, BV, ALL_STEPS, HAS_OUT, WRITE_STATE,
                        HAS_SNAP, EARLY, PREFETCH, PDL, PAIRED)
    else:
        _recur_body(b, h, vb, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, ssm_ptr, slots_ptr, n_ptr, snap_n_ptr,
                    snap_slot_ptr, H, stride_ssm, L, K, V, BV, ALL_STEPS, HAS_OUT, WRITE_STATE, HAS_SNAP, EARLY,
                    PREFETCH, PDL, PAIRED)


@triton.jit
def _out_gate(b, h, og_ptr, sg_ptr, stride_og, H, V: tl.constexpr):
    """sigmoid(og[b, h * V : (h + 1) * V]) in fp32 into sg [B, H * V], one channel a thread: the output norm's gate,
    computed once for the o_proj prologue (kind "gated_rms_sig") rather than by each of its programs."""
    c = tl.arange(0, V)
    g = tl.load(og_ptr + b * stride_og + h * V + c).to(tl.float32)
    tl.store(sg_ptr + (b * H + h) * V + c, tl.sigmoid(g))


@triton.jit
def _kda_fold_layers_kernel(ks, vs, gs, betas, ssms, xs, convs, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr, H,
                            stride_ssm, stride_xb, stride_xt, stride_conv, NVB, TAILS, NL: tl.constexpr,
                            L: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                            HAS_SNAP: tl.constexpr, EARLY: tl.constexpr, PREFETCH: tl.constexpr, W: tl.constexpr,
                            BW: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr):
    """ReplaySSM's fold of NL layers in one launch (the same blocks, commits and slots in each): grid axis 2 holds
    NL groups of NVB + TAILS programs, group l doing _kda_recur_kernel's fold programs (the recurrence, then the
    conv tails) over layer l's tensors (the l-th of each tuple). The layers' folds are independent; as separate
    launches each waited for the one before it. The recurrence is the same _recur_body, so the state stays
    bit-identical to the decoded one."""
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    layer = vb // (NVB + TAILS)
    vb = vb - layer * (NVB + TAILS)
    k_ptr, v_ptr, g_ptr, beta_ptr = ks[0], vs[0], gs[0], betas[0]
    ssm_ptr, x_ptr, conv_ptr = ssms[0], xs[0], convs[0]
    for i in tl.static_range(1, NL):
        if layer == i:
            k_ptr, v_ptr, g_ptr, beta_ptr = ks[i], vs[i], gs[i], betas[i]
            ssm_ptr, x_ptr, conv_ptr = ssms[i], xs[i], convs[i]
    if vb >= NVB:
        if PDL:
            if EARLY:
                gdc_wait()
        _fold_tail(b, h * TAILS + vb - NVB, x_ptr, conv_ptr, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr, H,
                   stride_xb, stride_xt, stride_conv, K, V, W, BW, BC, HAS_SNAP)
    else:
        _recur_body(b, h, vb, k_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, v_ptr, ssm_ptr, slots_ptr, n_ptr, snap_n_ptr,
                    snap_slot_ptr, H, stride_ssm, L, K, V, BV, False, False, True, HAS_SNAP, EARLY, PREFETCH, PDL)


@triton.jit
def _recur_body(b, h, vb, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, ssm_ptr, slots_ptr, n_ptr, snap_n_ptr,
                snap_slot_ptr, H, stride_ssm, L: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                ALL_STEPS: tl.constexpr, HAS_OUT: tl.constexpr, WRITE_STATE: tl.constexpr, HAS_SNAP: tl.constexpr,
                EARLY: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, PAIRED: tl.constexpr = False):
    """_kda_recur_kernel's recurrence (its program's block, head and column block)."""
    slot = tl.load(slots_ptr + b).to(tl.int64)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    tile = h * K * V + rk[:, None] * V + rv[None, :]
    # the committed state: written by an earlier step's decode or fold only (never by a kernel of this step before
    # this one), so with EARLY it is read before the wait
    S = tl.load(ssm_ptr + slot * stride_ssm + tile)
    if PDL:
        if EARLY:
            gdc_wait()
    n = L
    if not ALL_STEPS:
        n = tl.load(n_ptr + b)
    snap_n = 0
    dst = slot
    if HAS_SNAP:
        snap_n = tl.load(snap_n_ptr + b)
        dst = tl.load(snap_slot_ptr + b).to(tl.int64)
    if PREFETCH and PAIRED and HAS_OUT and L > 1:
        # as below, but step t's output sum (over S_t) goes out with step t + 1's sum over its decayed state, in one
        # two-operand reduction: one cross-warp round a step instead of two. Each sum is the same as alone.
        nq, nk, nv, ng, nbeta = _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b * L * H + h, rk, rv, K, V,
                                             HAS_OUT)
        pq = nq  # the query of the last step run, whose output is still to sum
        for t in tl.static_range(L):
            q, k, v, g, beta = nq, nk, nv, ng, nbeta
            if t + 1 < L:
                nq, nk, nv, ng, nbeta = _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, (b * L + t + 1) * H + h,
                                                     rk, rv, K, V, HAS_OUT)
            if t < n:
                Sa = S * tl.exp(g)[:, None]
                if t > 0:
                    sk, o = tl.reduce((Sa * k[:, None], S * pq[:, None]), 0, _sum_pair)
                    tl.store(o_ptr + ((b * L + t - 1) * H + h) * V + rv, o.to(o_ptr.dtype.element_ty))
                else:
                    sk = tl.sum(Sa * k[:, None], 0)
                S = Sa + (beta * k)[:, None] * (v - sk)[None, :]
                pq = q
                if HAS_SNAP:
                    if t + 1 == snap_n:
                        tl.store(ssm_ptr + dst * stride_ssm + tile, S)
            else:
                if t > 0:
                    if t == n:  # the last step run: its output alone
                        o = tl.sum(S * pq[:, None], 0).to(o_ptr.dtype.element_ty)
                        tl.store(o_ptr + ((b * L + t - 1) * H + h) * V + rv, o)
                tl.store(o_ptr + ((b * L + t) * H + h) * V + rv, tl.zeros([BV], o_ptr.dtype.element_ty))
        if n >= L:
            o = tl.sum(S * pq[:, None], 0).to(o_ptr.dtype.element_ty)
            tl.store(o_ptr + ((b * L + L - 1) * H + h) * V + rv, o)
    elif PREFETCH:
        nq, nk, nv, ng, nbeta = _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b * L * H + h, rk, rv, K, V,
                                             HAS_OUT)
        for t in tl.static_range(L):
            q, k, v, g, beta = nq, nk, nv, ng, nbeta
            if t + 1 < L:  # the next step's loads go out before this step's arithmetic and stores
                nq, nk, nv, ng, nbeta = _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, (b * L + t + 1) * H + h,
                                                     rk, rv, K, V, HAS_OUT)
            if t < n:
                S = _delta_update(S, k, v, g, beta)
                if HAS_OUT:
                    o = tl.sum(S * q[:, None], 0).to(o_ptr.dtype.element_ty)
                    tl.store(o_ptr + ((b * L + t) * H + h) * V + rv, o)
                if HAS_SNAP:
                    if t + 1 == snap_n:
                        tl.store(ssm_ptr + dst * stride_ssm + tile, S)
            elif HAS_OUT:  # a padding step: zeros (no separate fill launch before the kernel)
                tl.store(o_ptr + ((b * L + t) * H + h) * V + rv, tl.zeros([BV], o_ptr.dtype.element_ty))
    else:
        for t in range(L):
            row = (b * L + t) * H + h
            if t < n:
                q, k, v, g, beta = _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, rk, rv, K, V, HAS_OUT)
                S = _delta_update(S, k, v, g, beta)
                if HAS_OUT:
                    tl.store(o_ptr + row * V + rv, tl.sum(S * q[:, None], 0).to(o_ptr.dtype.element_ty))
                if HAS_SNAP:
                    if t + 1 == snap_n:
                        tl.store(ssm_ptr + dst * stride_ssm + tile, S)
            elif HAS_OUT:
                tl.store(o_ptr + row * V + rv, tl.zeros([BV], o_ptr.dtype.element_ty))
    if WRITE_STATE:
        tl.store(ssm_ptr + slot * stride_ssm + tile, S)


@triton.jit
def _kda_tail_kernel(x_ptr, conv_ptr, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr, H, stride_xb, stride_xt, stride_conv,
                     L: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr,
                     BC: tl.constexpr, HAS_SNAP: tl.constexpr, PDL: tl.constexpr):
    """The fold's conv tails alone (see _fold_tail): one program per (block, channel block)."""
    pdl_prologue(PDL)
    _fold_tail(tl.program_id(0).to(tl.int64), tl.program_id(1), x_ptr, conv_ptr, slots_ptr, n_ptr, snap_n_ptr,
               snap_slot_ptr, H, stride_xb, stride_xt, stride_conv, K, V, W, BW, BC, HAS_SNAP)


@triton.jit
def _fold_tail(b, cb, x_ptr, conv_ptr, slots_ptr, n_ptr, snap_n_ptr, snap_slot_ptr, H, stride_xb, stride_xt,
               stride_conv, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
               HAS_SNAP: tl.constexpr):
    """The fold's conv tails: block b's tail becomes window rows n .. n + W - 2 of [tail, x_b] (rows 1 .. W - 1 of
    step n - 1's window); with HAS_SNAP, rows snap_n .. into slot snap_slot. Channel block cb (none past the
    channels): every program reads and writes only its own channels."""
    slot = tl.load(slots_ptr + b).to(tl.int64)
    n = tl.load(n_ptr + b)
    C = H * (2 * K + V)
    ch = cb * BC + tl.arange(0, BC)
    tail = conv_ptr + slot * stride_conv
    xb = x_ptr + b * stride_xb
    if n > 0:
        win = _conv_window(xb, stride_xt, _tail_part(tail, n - 1, ch, C, W, BW), n - 1, ch, C, W, BW)
        if HAS_SNAP:
            snap_n = tl.load(snap_n_ptr + b)
            if snap_n > 0:
                dst = tl.load(snap_slot_ptr + b).to(tl.int64)
                swin = _conv_window(xb, stride_xt, _tail_part(tail, snap_n - 1, ch, C, W, BW), snap_n - 1, ch, C, W,
                                    BW)
                _store_tail(conv_ptr + dst * stride_conv, swin, ch, C, W, BW)
        tl.debug_barrier()
        _store_tail(tail, win, ch, C, W, BW)


def _checked(x, conv_state, ssm):
    H, K, V = ssm.shape[1:]
    assert conv_state[0].is_contiguous() and ssm[0].is_contiguous() and ssm.dtype == torch.float32
    assert x.shape[-1] == H * (2 * K + V) == conv_state.shape[2], "x / conv_state channel mismatch"
    assert V % min(RECUR_BV, V) == 0, "V must be a multiple of the recurrence block"
    return H, K, V


INT_DTYPES = (torch.int32, torch.int64)


def _device_ints(v, device) -> torch.Tensor:
    """A per-sequence int list (or tensor) as an int32 device tensor (a tensor stays put: graph replays; the
    kernels read int64 ones as they are)."""
    if isinstance(v, torch.Tensor):
        if v.dtype in INT_DTYPES and v.device == torch.device(device):
            return v
        return v.to(device=device, dtype=torch.int32)
    return torch.tensor(v, dtype=torch.int32, device=device)


def _logits(beta: torch.Tensor, is_logits: bool) -> torch.Tensor | None:
    """beta's logits as [rows, H] with unit column stride (for the prep kernel), or None when beta is given."""
    if not is_logits:
        return None
    b = beta.reshape(-1, beta.shape[-1])
    return b if b.stride(-1) == 1 else b.contiguous()


# the fold's conv tails in the recurrence's launch (extra programs beside it), not a launch of their own
FOLD_TAIL_IN_RECUR = True
FOLD_TAIL_BC = 256  # channels per tail program


def _launch_recur(q, k, v, g, beta, o, ssm, slots, n, snaps, write_state: bool, tail=None, gates=None):
    """tail: (the fold's record x, conv_state) to fold the conv tails in the same launch; gates: (og [B, H * V],
    sg [B, H * V] fp32) to write sigmoid(og) into sg in the same launch (_out_gate)."""
    B, L, H, K = k.shape
    V = v.shape[-1]
    BV = min(RECUR_BV, V)
    snap_n = snap_slot = slots
    if snaps is not None:
        snap_n, snap_slot = snaps
    NVB, tails, W = V // BV, 0, 1
    x, conv = (k, k) if tail is None else tail
    if tail is not None:
        tails = triton.cdiv(triton.cdiv(x.shape[2], FOLD_TAIL_BC), H)  # tail programs per head
        W = conv.shape[1] + 1
    assert tail is None or gates is None
    og, sg = gates if gates is not None else (k, k)
    if B and L:
        _kda_recur_kernel[(B, H, NVB + tails + (gates is not None))](
            q if q is not None else k, k, v, g, beta, o if o is not None else v, ssm, slots,
            n if n is not None else slots, snap_n, snap_slot, H, ssm.stride(0), x, conv,
            x.stride(0), x.stride(1), conv.stride(0), NVB, tails, L=L, K=K, V=V, BV=BV,
            ALL_STEPS=n is None, HAS_OUT=o is not None, WRITE_STATE=write_state, HAS_SNAP=snaps is not None,
            EARLY=EARLY_STATE, PREFETCH=RECUR_PREFETCH and K <= RECUR_PREFETCH_MAX_K, TAIL=tail is not None,
            W=W, BW=triton.next_power_of_2(W), BC=FOLD_TAIL_BC, PAIRED=RECUR_PAIRED_SUMS, og_ptr=og, sg_ptr=sg,
            stride_og=og.stride(0), GATES=gates is not None, num_warps=RECUR_WARPS, **pdl_args(k))


def kda_decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale,
               beta_logits: bool = False, out_gate=None):
    """See kestrel.ops.kda.decode. fp64 inputs go to the reference."""
    if mixed.dtype == torch.float64:
        from kestrel.ops.kda.reference import kda_decode as ref
        o = ref(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale,
                beta_logits)
        return (o, None) if out_gate is not None else o
    B = mixed.shape[0]
    H, K, V = _checked(mixed, conv_state, ssm)
    x = (mixed if mixed.stride(-1) == 1 else mixed.contiguous()).unsqueeze(1)  # rows may be strided
    q, k, v, g, b = launch_prep(x, conv_weight, conv_state, slots, raw_gate, A_log, dt_bias, lower_bound, scale,
                                H, K, V, write_tail=True, beta_logits=_logits(beta, beta_logits), early=EARLY_STATE)
    o = torch.empty(B, 1, H, V, dtype=mixed.dtype, device=mixed.device)
    gates = None
    if out_gate is not None and out_gate.dim() == 2 and out_gate.shape == (B, H * V) and out_gate.stride(-1) == 1:
        gates = (out_gate, torch.empty(B, H * V, dtype=torch.float32, device=mixed.device))
    _launch_recur(q, k, v, g, b if b is not None else beta.contiguous(), o, ssm, slots, None, None, write_state=True,
                  gates=gates)
    if out_gate is not None:
        return o.view(B, H, V), gates[1] if gates is not None else None
    return o.view(B, H, V)


def kda_verify(x, raw_gate, beta, lens, conv_weight, conv_state, ssm, slots, A_log, dt_bias, lower_bound, scale,
               snapshot_states: bool = False, beta_logits: bool = False):
    """See reference.kda_verify; `lens` may be a device tensor. fp64 and the snapshot baseline go to the reference.
    The record's steps past a block's length hold that step's real inputs (the fold never reaches them)."""
    from kestrel.ops.kda import reference as R

    if x.dtype == torch.float64 or snapshot_states:
        if isinstance(lens, torch.Tensor):
            lens = lens.tolist()
        return R.kda_verify(x, raw_gate, beta, lens, conv_weight, conv_state, ssm, slots, A_log, dt_bias, lower_bound,
                            scale, snapshot_states, beta_logits)
    B, L, C = x.shape
    H, K, V = _checked(x, conv_state, ssm)
    if x.stride(2) != 1:
        x = x.contiguous()  # (a block's rows may be strided: the rows of the fused projection's wider output)
    q, k, v, g, b = launch_prep(x, conv_weight, conv_state, slots, raw_gate, A_log, dt_bias, lower_bound, scale,
                                H, K, V, write_tail=False, beta_logits=_logits(beta, beta_logits), early=EARLY_STATE)
    beta = b if b is not None else beta.contiguous()
    o = torch.empty(B, L, H, V, dtype=x.dtype, device=x.device)  # the recurrence writes zeros past each block
    _launch_recur(q, k, v, g, beta, o, ssm, slots, _device_ints(lens, x.device), None, write_state=False)
    return o, R.KDAReplay(x, k, v, g, beta)


def _fold_ints(commit, snapshots, device):
    """(commit counts, snapshots as (steps, slot) or None) as device integers."""
    n = _device_ints(commit, device)
    snaps = None
    if isinstance(snapshots, tuple):  # the device form: (steps, slot) tensors, 0 steps = none
        snaps = (_device_ints(snapshots[0], device), _device_ints(snapshots[1], device))
    elif snapshots is not None and any(s is not None for s in snapshots):
        snaps = (_device_ints([0 if s is None else s[0] for s in snapshots], device),
                 _device_ints([0 if s is None else s[1] for s in snapshots], device))
    return n, snaps


# fold_layers folds every layer in one launch (off: one launch a layer, each waiting for the one before it, as the
# graph's last kernels of a speculative step). H200, bundled k3-small + drafter, batch 1, the engine's greedy step
# graph (benchmarks/step_knobs.py, 2026-12-04): 0.2711 -> 0.2589 ms (1.047x), 168 -> 163 kernels, in two calls.
FOLD_LAYERS_ONE_LAUNCH = True


def kda_fold_layers(recs, conv_states, ssms, slots, commit, snapshots=None) -> None:
    """kda_fold of several layers over the same slots and commits, in one launch when their tensors share shapes,
    strides and dtypes (a model's KDA layers do), else one launch a layer."""
    rec0, conv0, ssm0 = recs[0], conv_states[0], ssms[0]

    def layout(*ts):
        return tuple((t.shape, t.stride(), t.dtype, t.device) for t in ts)

    one = (FOLD_LAYERS_ONE_LAUNCH and FOLD_TAIL_IN_RECUR and len(recs) > 1 and rec0.states is None
           and rec0.x.dtype != torch.float64 and rec0.x.stride(2) == 1
           and all(r.states is None and layout(r.x, r.k, r.v, r.g, r.beta, c, m) ==
                   layout(rec0.x, rec0.k, rec0.v, rec0.g, rec0.beta, conv0, ssm0)
                   for r, c, m in zip(recs, conv_states, ssms, strict=True)))
    if not one:
        for rec, conv, ssm in zip(recs, conv_states, ssms, strict=True):
            kda_fold(rec, conv, ssm, slots, commit, snapshots)
        return
    B, L, C = rec0.x.shape
    H, K, V = _checked(rec0.x, conv0, ssm0)
    n, snaps = _fold_ints(commit, snapshots, rec0.x.device)
    if not B:
        return
    snap_n, snap_slot = snaps if snaps is not None else (slots, slots)
    BV = min(RECUR_BV, V)
    NVB, W = V // BV, conv0.shape[1] + 1
    tails = triton.cdiv(triton.cdiv(C, FOLD_TAIL_BC), H)
    _kda_fold_layers_kernel[(B, H, (NVB + tails) * len(recs))](
        tuple(r.k for r in recs), tuple(r.v for r in recs), tuple(r.g for r in recs), tuple(r.beta for r in recs),
        tuple(ssms), tuple(r.x for r in recs), tuple(conv_states), slots, n, snap_n, snap_slot, H, ssm0.stride(0),
        rec0.x.stride(0), rec0.x.stride(1), conv0.stride(0), NVB, tails, NL=len(recs), L=L, K=K, V=V, BV=BV,
        HAS_SNAP=snaps is not None, EARLY=EARLY_STATE, PREFETCH=RECUR_PREFETCH and K <= RECUR_PREFETCH_MAX_K, W=W,
        BW=triton.next_power_of_2(W), BC=FOLD_TAIL_BC, num_warps=RECUR_WARPS, **pdl_args(rec0.k))


def kda_fold(rec, conv_state, ssm, slots, commit, snapshots=None) -> None:
    """See reference.kda_fold; `commit` may be a device tensor. The snapshot baseline and fp64 go to the
    reference."""
    from kestrel.ops.kda import reference as R

    if rec.states is not None or rec.x.dtype == torch.float64:
        if isinstance(commit, torch.Tensor):
            commit = commit.tolist()
        return R.kda_fold(rec, conv_state, ssm, slots, commit, snapshots)
    B, L, C = rec.x.shape
    H, K, V = _checked(rec.x, conv_state, ssm)
    W = conv_state.shape[1] + 1
    n, snaps = _fold_ints(commit, snapshots, rec.x.device)
    if not B:
        return
    assert rec.x.stride(2) == 1
    if FOLD_TAIL_IN_RECUR:
        _launch_recur(None, rec.k, rec.v, rec.g, rec.beta, None, ssm, slots, n, snaps, write_state=True,
                      tail=(rec.x, conv_state))
        return
    _launch_recur(None, rec.k, rec.v, rec.g, rec.beta, None, ssm, slots, n, snaps, write_state=True)
    BC = FOLD_TAIL_BC
    s_n, s_slot = snaps if snaps is not None else (n, n)
    _kda_tail_kernel[(B, triton.cdiv(C, BC))](rec.x, conv_state, slots, n, s_n, s_slot, H, rec.x.stride(0),
                                             rec.x.stride(1), conv_state.stride(0),
                                             L=L, K=K, V=V, W=W, BW=triton.next_power_of_2(W), BC=BC,
                                             HAS_SNAP=snaps is not None, num_warps=4, **pdl_args(rec.x))
