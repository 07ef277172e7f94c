"""Plain-torch Kimi Delta Attention: the oracle every KDA kernel is tested against.

Per head, with state S in R^{K x V} (kept in fp32, or fp64 when the inputs are fp64):
    S <- diag(exp(g_t)) S;  u = v_t - S^T k_t;  S <- S + beta_t k_t u^T;  o_t = S^T (scale * q_t)
q and k arrive already L2-normalised; `scale` (K^-1/2 by default) is applied to q here.

Two forms compute the same function:
- `kda_recurrent`: the token loop above (decode, and ReplaySSM's fold).
- `kda_chunked`: the WY form over chunks, packed variable-length sequences with cu_seqlens. Every exponent it
  takes is a difference of cumulative gates that is <= 0, so a chunk of safe gates summing to -320 cannot overflow.
  Chunks are aligned to absolute positions (a sequence that starts mid-chunk is front-padded with no-op tokens),
  so the state at every chunk boundary is available for prefix-cache checkpoints.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kestrel.ops import host_ints


def state_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the recurrent state for a given activation dtype: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, computed in at least fp32."""
    xf = x.to(state_dtype_for(x.dtype))
    return (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


def kda_gate(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None) -> torch.Tensor:
    """Per-channel log-decay g from the gate bottleneck output.

    raw: [..., H, K]; A_log: [H]; dt_bias: [H * K]. Returns g <= 0 in the state dtype.
    lower_bound None: Kimi-Linear form g = -exp(A_log) * softplus(raw + dt_bias).
    lower_bound lb:   K3 safe gate    g = lb * sigmoid(exp(A_log) * (raw + dt_bias)), so g is in (lb, 0).
    """
    dt = state_dtype_for(raw.dtype)
    H, K = raw.shape[-2:]
    x = raw.to(dt) + dt_bias.to(dt).view(H, K)
    a = torch.exp(A_log.to(dt)).view(H, 1)
    if lower_bound is None:
        return -a * F.softplus(x)
    return lower_bound * torch.sigmoid(a * x)


def kda_update(state: torch.Tensor, k, v, g, beta) -> None:
    """The state half of one recurrence step, in place on `state` [N, H, K, V]; k, g: [N, H, K]; v: [N, H, V];
    beta: [N, H]. ReplaySSM's fold calls exactly this with the inputs the verify pass stored, so the folded state
    is bit-identical to the state the plain recurrence commits. k = g = beta = 0 is an exact no-op."""
    dt = state.dtype
    k, v, g, beta = (t.to(dt) for t in (k, v, g, beta))
    state.mul_(torch.exp(g).unsqueeze(-1))
    # batched matmuls, not einsum: on CPU einsum's permute + copy made a batch-64 decode step ~10x slower
    u = v - (k.unsqueeze(-2) @ state).squeeze(-2)
    state.addcmul_((beta.unsqueeze(-1) * k).unsqueeze(-1), u.unsqueeze(-2))


def kda_step(state: torch.Tensor, q, k, v, g, beta, scale: float) -> torch.Tensor:
    """One recurrence step (kda_update, then the read o = S^T (scale q)); returns o [N, H, V] in the state dtype."""
    kda_update(state, k, v, g, beta)
    return ((q.to(state.dtype) * scale).unsqueeze(-2) @ state).squeeze(-2)


def kda_recurrent(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None):
    """Token-by-token KDA over a batch of equal-length sequences.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; initial_state: [B, H, K, V] or None (zeros).
    Returns (o [B, T, H, V] in v's dtype, final_state [B, H, K, V] in the state dtype).
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    dt = state_dtype_for(v.dtype)
    state = torch.zeros(B, H, K, V, dtype=dt, device=v.device) if initial_state is None else initial_state.to(dt).clone()
    out = torch.empty(B, T, H, V, dtype=dt, device=v.device)
    for t in range(T):
        out[:, t] = kda_step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale)
    return out.to(v.dtype), state


def _chunked_batched(q, k, v, g, beta, scale, state, chunk_size, factored: bool, keep_states: bool = True):
    """WY-form KDA for [B, T, H, *] inputs with T a multiple of chunk_size, all in the state dtype.

    factored: exp(gc_i - gc_j) is taken as exp(gc_i - m) * exp(m - gc_j) around each chunk's middle m (matmuls
    only; the caller checked that |gc - m| stays far inside fp32's exp range), and everything that does not read the
    state is computed for all chunks at once, before the loop over chunks; else pairwise per chunk, every exponent
    <= 0. Returns o [B, T, H, V], the final state, and (keep_states) the state after every chunk [B, N, H, K, V].
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    C, N = chunk_size, T // chunk_size
    # [B, H, N, C, *], contiguous (the elementwise passes below run over whole tensors)
    q, k, v, g = (t.reshape(B, N, C, H, -1).permute(0, 3, 1, 2, 4).contiguous() for t in (q, k, v, g))
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2).unsqueeze(-1).contiguous()
    gc = g.cumsum(-2)
    incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    strict = torch.tril(incl, diagonal=-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    out = torch.empty(B, H, N, C, V, dtype=q.dtype, device=q.device)
    g_last = gc[..., -1:, :]  # [B, H, N, 1, K]
    decay_last = torch.exp(g_last).transpose(-1, -2).contiguous()  # [B, H, N, K, 1]
    k_tail = (k * torch.exp(g_last - gc)).transpose(-1, -2).contiguous()  # [B, H, N, K, C]
    egc = torch.exp(gc)
    q_dec = q * scale * egc  # scaled q_i Gamma_i
    if factored:
        # the state-free part of every chunk at once: (I + A) U = diag(beta) (v - (k Gamma) S0) splits into
        # U = U0 - W S0, with U0 and W for all chunks together (both right-hand sides through one inverse)
        mid = gc[..., C // 2 : C // 2 + 1, :]
        rise = torch.exp(gc - mid)
        k_out = (k / rise).transpose(-1, -2)  # k_j exp(m - gc_j)
        # entries above the diagonal may overflow: masked_fill discards them whatever they hold
        lower = eye + beta * ((k * rise) @ k_out).masked_fill(~strict, 0)
        qk = ((q * scale * rise) @ k_out).masked_fill(~incl, 0)
        # the inverse of I + A first, then one product (as fla's chunk_kda forms it): LAPACK's batched solve of
        # [C, C] systems costs per right-hand column, ~3x the two steps at K + V = 128 columns on this CPU
        inv = torch.linalg.solve_triangular(lower, eye.expand_as(lower), upper=False, unitriangular=True)
        sol = inv @ torch.cat([beta * (k * egc), beta * v], dim=-1)
        w_all, u0_all = sol[..., :K], sol[..., K:]
    states = []
    for n in range(N):
        if factored:
            u = torch.baddbmm(u0_all[:, :, n].flatten(0, 1), w_all[:, :, n].flatten(0, 1), state.flatten(0, 1),
                              alpha=-1).view(B, H, C, V)
            qkn = qk[:, :, n]
        else:
            qn, kn, vn, gn, bn = q[:, :, n], k[:, :, n], v[:, :, n], gc[:, :, n], beta[:, :, n]
            # decay[i, j] = exp(gc_i - gc_j) for j <= i, else 0: every exponent is <= 0
            diff = (gn.unsqueeze(-2) - gn.unsqueeze(-3)).masked_fill(~incl.unsqueeze(-1), float("-inf"))
            decay = torch.exp(diff)  # [B, H, C, C, K]
            kk = torch.einsum("bhik,bhjk,bhijk->bhij", kn, kn, decay).masked_fill(~strict, 0)
            qkn = torch.einsum("bhik,bhjk,bhijk->bhij", qn * scale, kn, decay)
            # (I + A) U = diag(beta) (v - (k * exp(gc)) S0), A strictly lower with A_ij = beta_i k_i.(decay_ij k_j)
            rhs = bn * (vn - (kn * egc[:, :, n]) @ state)
            u = torch.linalg.solve_triangular(eye + bn * kk, rhs, upper=False, unitriangular=True)
        out[:, :, n] = q_dec[:, :, n] @ state + qkn @ u
        # S' = exp(g_last) S + (k exp(g_last - gc))^T U: the decayed copy takes the product in place
        nxt = decay_last[:, :, n] * state
        nxt.view(B * H, K, V).baddbmm_(k_tail[:, :, n].flatten(0, 1), u.flatten(0, 1))
        state = nxt
        if keep_states:
            states.append(state)
    out = out.permute(0, 2, 3, 1, 4).reshape(B, T, H, V)
    return out, state, torch.stack(states, 1) if keep_states else None


# bytes of inputs and state a group of sequences takes through the CPU's chunked form at once (see kda_chunked)
CPU_GROUP_BYTES = 6 << 20

# the factored form runs on 16-token sub-chunks while every gate is above this: |gc - m| <= 8 * 10 = 80
_FACTORED_CHUNK, _FACTORED_MIN_GATE = 16, -10.0


def kda_chunked(
    q, k, v, g, beta,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    start_positions: list[int] | None = None,
    chunk_size: int = 64,
    output_chunk_states: bool = False,
):
    """Chunked (WY) KDA over packed variable-length sequences.

    q, k, g: [T, H, K]; v: [T, H, V]; beta: [T, H], sequences packed back to back with cu_seqlens ([N + 1];
    None = one sequence). initial_state: [N, H, K, V] or None (zeros). start_positions: absolute position of
    each sequence's first token (default 0); chunks are aligned to absolute multiples of chunk_size.

    Returns (o [T, H, V] in v's dtype, final_state [N, H, K, V]) and, with output_chunk_states, a list of
    (positions, states [n_i, H, K, V]) per sequence: the state after every absolute chunk boundary crossed,
    positions being the absolute token count each state has consumed (the last one is the final state).
    """
    T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    if cu_seqlens is None:
        cu_seqlens = [0, T]
    cu = [int(x) for x in cu_seqlens]
    n_seq = len(cu) - 1
    starts = [0] * n_seq if start_positions is None else [int(s) for s in start_positions]
    dt = state_dtype_for(v.dtype)
    # sub-chunks of 16 with factored decays when the gates allow (much cheaper on CPU); boundaries stay absolute,
    # so the states at multiples of chunk_size are among the sub-chunk states
    factored = chunk_size % _FACTORED_CHUNK == 0 and (g.numel() == 0 or float(g.min()) >= _FACTORED_MIN_GATE)
    C = _FACTORED_CHUNK if factored else chunk_size
    fronts = [s % C for s in starts]
    lens = [cu[i + 1] - cu[i] for i in range(n_seq)]
    Tp = max(-(-(f + L) // C) * C for f, L in zip(fronts, lens)) if n_seq else 0

    # pad each sequence with no-op tokens (k = v = g = beta = 0 leave the state unchanged) to whole chunks; a batch of
    # whole-chunk sequences starting at chunk boundaries is one view (a batch of equal prompts: no per-sequence copies)
    aligned = n_seq > 0 and all(f == 0 and L == Tp for f, L in zip(fronts, lens))

    def pad(x):
        if aligned:
            return x.to(dt).view(n_seq, Tp, *x.shape[1:])
        buf = x.new_zeros((n_seq, Tp, *x.shape[1:]), dtype=dt)
        for i in range(n_seq):
            buf[i, fronts[i] : fronts[i] + lens[i]] = x[cu[i] : cu[i + 1]]
        return buf

    qp, kp, vp, gp, bp = (pad(t) for t in (q, k, v, g, beta))
    S0 = torch.zeros(n_seq, H, K, V, dtype=dt, device=v.device) if initial_state is None else initial_state.to(dt)
    # on a CPU, sequences in groups whose working set stays in cache: each pass over a group's tensors then reads
    # the cache, not DRAM (64 sequences of 64 tokens at k3-small's shapes: ~1.2-1.4x faster in three groups)
    per_seq = (Tp * H * (K + V) + H * K * V) * S0.element_size()
    group = max(1, n_seq if v.is_cuda else min(n_seq, CPU_GROUP_BYTES // max(1, per_seq)))
    group = -(-n_seq // -(-n_seq // group)) if n_seq else 1  # the same number of groups, sized evenly
    parts = [_chunked_batched(qp[a : a + group], kp[a : a + group], vp[a : a + group], gp[a : a + group],
                              bp[a : a + group], scale, S0[a : a + group], C, factored, output_chunk_states)
             for a in range(0, max(n_seq, 1), group)]
    o_pad, final, states = parts[0] if len(parts) == 1 else (
        torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
        torch.cat([p[2] for p in parts]) if output_chunk_states else None)
    if aligned:
        out = o_pad.reshape(n_seq * Tp, *o_pad.shape[2:]).to(v.dtype)
    else:
        out = torch.cat([o_pad[i, fronts[i] : fronts[i] + lens[i]] for i in range(n_seq)]).to(v.dtype)
    if not output_chunk_states:
        return out, final
    per_seq = []
    for i in range(n_seq):
        n_i = -(-(fronts[i] + lens[i]) // C)
        base = starts[i] - fronts[i]
        end = starts[i] + lens[i]
        keep = [j for j in range(n_i) if (base + (j + 1) * C) % chunk_size == 0 or base + (j + 1) * C >= end]
        pos = [min(base + (j + 1) * C, end) for j in keep]
        per_seq.append((pos, states[i, keep]))
    return out, final, per_seq


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor | None):
    """Depthwise causal conv + SiLU of one or many sequences continuing from a cached tail.

    x [N, L, C]; weight [C, W]; tail [N, W - 1, C] (the previous W - 1 inputs; None = zeros).
    Returns (y [N, L, C], window [N, W - 1 + L, C]); the new tail after token j is window[:, j + 1 : j + W].
    The taps are summed in a fixed order whatever L is (vectorised SiLU may still round differently by length).
    """
    N, L, C = x.shape
    W = weight.shape[1]
    if tail is None:
        tail = x.new_zeros(N, W - 1, C)
    window = torch.cat([tail.to(x.dtype), x], dim=1)
    w = weight.to(x.dtype).t().contiguous()  # tap j's weights w[j] contiguous (a strided column is ~2x slower)
    y = window[:, 0:L] * w[0]
    for j in range(1, W):
        y = y + window[:, j : j + L] * w[j]
    return F.silu(y), window


# rows of a CPU elementwise chain taken at once (bytes of one block: cache-resident across the chain's passes)
CPU_BLOCK_BYTES = 768 << 10


class PackedConvWindows:
    """The depthwise causal conv + SiLU of packed sequences in one pass (causal_conv1d's arithmetic, tap by tap in
    the same order, without a loop over sequences): x [T, C] packed by cu (N + 1 offsets), each sequence
    continuing from its tail [N, W - 1, C]. `y` [T, C] is the output; `rows(seqs, ends)` the W - 1 inputs before
    relative position ends[k] of sequence seqs[k] (the conv tail after its first ends[k] tokens; tail rows where
    that reaches before the sequence's first token). Index lists are built on the host (no device synchronisation)."""

    def __init__(self, x: torch.Tensor, cu: list[int], weight: torch.Tensor, tails: torch.Tensor):
        T, C = x.shape
        N, W = len(cu) - 1, weight.shape[1]
        self.W, self.N, self.cu = W, N, cu
        # src = [tail of sequence 1 | ... | tail of sequence N - 1 | tail of sequence 0 | x]
        self.src = torch.cat([tails[1:].to(x.dtype).reshape((N - 1) * (W - 1), C), tails[0].to(x.dtype), x])
        w = weight.to(x.dtype).t().contiguous()  # tap j's weights w[j] contiguous (a strided column is ~2x slower)
        # every token's taps as shifted slices of src: right for a sequence's own rows, and for the first W - 1
        # tokens of sequence 0, whose tail sits just before x (so a single sequence needs nothing more) ...
        base = N * (W - 1) - (W - 1)
        y = torch.empty(T, C, dtype=x.dtype, device=x.device)
        # ... on a CPU in blocks of rows that stay in cache across the taps (the same sums, elementwise: the same
        # bits; [4096, 768] fp32: ~1.8x faster than whole-tensor passes, which each go to DRAM)
        rows = T if x.is_cuda else max(16, CPU_BLOCK_BYTES // max(1, C * x.element_size()))
        part = torch.empty(min(rows, T), C, dtype=x.dtype, device=x.device)
        for a in range(0, T, rows):
            b = min(a + rows, T)
            yb = torch.mul(self.src[base + a : base + b], w[0], out=y[a:b])
            for j in range(1, W):
                yb.add_(torch.mul(self.src[base + a + j : base + b + j], w[j], out=part[: b - a]))
        if N > 1:
            # ... the first W - 1 tokens of the others again, through their own tail rows (the same sums in order)
            near = [(i, r) for i in range(1, N) for r in range(min(W - 1, cu[i + 1] - cu[i]))]
            if near:
                idx = host_ints([cu[i] + r for i, r in near]
                                + [self._row(i, r - (W - 1) + j) for j in range(W) for i, r in near],
                                x.device).view(W + 1, len(near))
                fix = self.src.index_select(0, idx[1]) * w[0]
                for j in range(1, W):
                    fix = fix + self.src.index_select(0, idx[1 + j]) * w[j]
                y[idx[0]] = fix
        self.y = F.silu(y)

    def _row(self, i: int, r: int) -> int:
        """The row of src holding relative position r (>= -(W - 1)) of sequence i."""
        W = self.W
        if r >= 0:
            return self.N * (W - 1) + self.cu[i] + r
        return (i - 1 if i else self.N - 1) * (W - 1) + (W - 1) + r

    def rows(self, seqs: list[int], ends: list[int]) -> torch.Tensor:
        """[len(seqs), W - 1, C]: the inputs at relative positions ends[k] - (W - 1) .. ends[k] - 1 of seqs[k]."""
        W = self.W
        idx = [self._row(i, e - (W - 1) + m) for i, e in zip(seqs, ends) for m in range(W - 1)]
        return self.src[host_ints(idx, self.src.device)].view(len(seqs), W - 1, -1)


def slot_rows(slots: torch.Tensor):
    """`slots` as a slice when they are consecutive ascending ids on the CPU (then ssm[rows] is a view updated in
    place, with no gather and scatter of whole states), else the index tensor itself. Same arithmetic either way."""
    n = slots.numel()
    if slots.is_cuda or n == 0:
        return slots
    first = int(slots[0])
    if int(slots[-1]) - first != n - 1 or (n > 2 and not bool((slots.diff() == 1).all())):
        return slots
    return slice(first, first + n)


def beta_from_logits(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """KDA's beta = sigmoid(b) in the state dtype for activations of `dtype`."""
    return torch.sigmoid(b.to(state_dtype_for(dtype)))


def kda_decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale,
               beta_logits: bool = False):
    """Reference of the fused decode step (see kestrel.ops.kda.decode)."""
    if beta_logits:
        beta = beta_from_logits(beta, mixed.dtype)
    B = mixed.shape[0]
    H, K, V = ssm.shape[1:]
    rows = slot_rows(slots)
    y, window = causal_conv1d(mixed.unsqueeze(1), conv_weight, conv_state[rows])
    conv_state[rows] = window[:, 1:]
    q, k, v = y[:, 0].view(B, 3, H, -1).unbind(1)
    g = kda_gate(raw_gate, A_log, dt_bias, lower_bound)
    state = ssm[rows]  # a view when rows is a slice: the step updates the pool in place
    o = kda_step(state, l2norm(q), l2norm(k), v, g, beta, scale)
    if not isinstance(rows, slice):
        ssm[slots] = state
    return o.to(v.dtype)


def kda_chunked_factored(q, k, v, g, beta, scale: float | None = None, chunk_size: int = 16, min_gate: float = -5.0):
    """Training form of chunked KDA: equal-length batch [B, T, H, *], zero initial state, matmul-only intra-chunk.

    exp(gc_i - gc_j) is factored as exp(gc_i - m) * exp(m - gc_j) around each chunk's middle cumulative gate m,
    which is finite only while |gc - m| stays far below fp32's exp limit (~88): with gates bounded below by
    min_gate (the safe gate's lower bound) and chunk_size 16, |gc - m| <= 8 * |min_gate| = 40. Differentiable;
    computed in fp32 (fp64 for fp64 inputs). Returns o [B, T, H, V] in v's dtype.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    assert C * abs(min_gate) / 2 < 60, "factored chunks would overflow: use a smaller chunk_size"
    scale = K**-0.5 if scale is None else scale
    dt = state_dtype_for(v.dtype)
    pad = (-T) % C
    q, k, v, g, beta = (F.pad(t.to(dt), (0, 0) * (t.dim() - 2) + (0, pad)) if t.dim() == 3 else
                        F.pad(t.to(dt), (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g, beta))
    N = (T + pad) // C
    # [B, H, N, C, *]
    q, k, v, g = (t.reshape(B, N, C, H, -1).permute(0, 3, 1, 2, 4) for t in (q, k, v, g))
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2).unsqueeze(-1)
    gc = g.cumsum(-2)
    mid = gc[..., C // 2 : C // 2 + 1, :]
    k_in, k_out = k * torch.exp(gc - mid), k * torch.exp(mid - gc)
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), -1)
    incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    A = (k_in @ k_out.transpose(-1, -2)).masked_fill(~strict, 0) * beta
    Qk = ((q * scale * torch.exp(gc - mid)) @ k_out.transpose(-1, -2)).masked_fill(~incl, 0)
    lower = torch.eye(C, dtype=dt, device=q.device) + A
    # both right-hand sides at once: W for the state-dependent part, U0 for the values
    rhs = torch.cat([beta * k * torch.exp(gc), beta * v], dim=-1)
    sol = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    Wk, U0 = sol[..., :K], sol[..., K:]
    q_dec = q * scale * torch.exp(gc)
    g_last = gc[..., -1:, :]
    k_tail = k * torch.exp(g_last - gc)
    state = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    outs = []
    for n in range(N):
        u = U0[:, :, n] - Wk[:, :, n] @ state
        outs.append(q_dec[:, :, n] @ state + Qk[:, :, n] @ u)
        state = torch.exp(g_last[:, :, n]).transpose(-1, -2) * state + k_tail[:, :, n].transpose(-1, -2) @ u
    o = torch.stack(outs, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(v.dtype)


@dataclass
class KDAReplay:
    """What a verify pass stores per KDA layer so that ReplaySSM can commit any accepted prefix later.

    Sequences padded to the block length L; padded steps are exact no-ops (k = g = beta = 0).
    x: the conv inputs [B, L, C] (the new conv tail is read from them); k, g [B, L, H, K]; v [B, L, H, V];
    beta [B, L, H]. With the snapshot baseline, `states` [B, L, H, K, V] holds the state after every step instead.
    """

    x: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    g: torch.Tensor | None
    beta: torch.Tensor | None
    states: torch.Tensor | None = None

    def nbytes(self) -> int:
        """Bytes held for the draft window (what the rollback method costs in memory)."""
        parts = (self.states,) if self.states is not None else (self.k, self.v, self.g, self.beta)
        return sum(t.numel() * t.element_size() for t in (self.x, *parts))


def kda_verify(x, raw_gate, beta, lens: list[int], conv_weight, conv_state, ssm, slots, A_log, dt_bias, lower_bound,
               scale, snapshot_states: bool = False, beta_logits: bool = False):
    """Speculative verify over padded blocks: reads the committed conv tail and state of `slots`, writes neither.

    x [B, L, C] conv inputs, raw_gate [B, L, H, K], beta [B, L, H] (its logits with beta_logits); block i has lens[i]
    tokens and the positions past it are turned into exact no-ops (k = g = beta = 0). Returns (o [B, L, H, V],
    KDAReplay).
    """
    if beta_logits:
        beta = beta_from_logits(beta, x.dtype)
    B, L, C = x.shape
    H, K, V = ssm.shape[1:]
    rows = slot_rows(slots)  # consecutive slots are read through a view (nothing here writes them)
    y, _ = causal_conv1d(x, conv_weight, conv_state[rows])
    q, k, v = y.view(B, L, 3, H, -1).unbind(2)
    q, k = l2norm(q), l2norm(k)
    g = kda_gate(raw_gate, A_log, dt_bias, lower_bound)
    if min(lens) < L:  # padded steps become exact no-ops (the masks multiply every real step by exactly 1)
        valid = (torch.arange(L, device=x.device)[None, :] < torch.tensor(lens, device=x.device)[:, None])  # [B, L]
        k, g = k * valid[..., None, None].to(y.dtype), g * valid[..., None, None]
        beta = beta * valid[..., None].to(beta.dtype)
    # the closed form, unless the snapshot baseline needs every step's state or the gates are too steep for it
    # gates above lower_bound: the cumulative gate stays above L * lower_bound, so the closed form needs no check
    safe = lower_bound is not None and L * lower_bound >= _BLOCK_MIN_CUMGATE
    o = None if snapshot_states else kda_block_outputs(q, k, v, g, beta, ssm[rows], scale, checked=safe)
    states = []
    if o is None:  # the token loop on a copy of the committed state
        state, out = ssm[rows].clone(), []
        for t in range(L):
            out.append(kda_step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale))
            if snapshot_states:
                states.append(state.clone())
        o = torch.stack(out, 1)
    if snapshot_states:
        return o.to(v.dtype), KDAReplay(x, None, None, None, None, torch.stack(states, 1))
    return o.to(v.dtype), KDAReplay(x, k, v, g, beta)


# the closed form scales keys by exp(-cumulative gate): allowed while that stays below exp(80) (fp32 holds 3e38)
_BLOCK_MIN_CUMGATE = -80.0


def _block_masks(L: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(identity [L, L], upper incl. the diagonal, strictly upper) of one block length, made once."""
    key = (L, dtype, str(device))
    masks = _BLOCK_MASKS.get(key)
    if masks is None:
        upper = torch.ones(L, L, dtype=torch.bool, device=device).triu()
        masks = _BLOCK_MASKS[key] = (torch.eye(L, dtype=dtype, device=device), upper, upper.triu(1))
    return masks


_BLOCK_MASKS: dict = {}


def kda_block_outputs(q, k, v, g, beta, state, scale: float, checked: bool = False):
    """The outputs of L recurrence steps from `state` (not written) in closed form: one WY chunk, a dozen batched
    products instead of L dependent steps (the CPU verify pass; ~4x fewer launches at L = 8). q, k, g [B, L, H, K];
    v [B, L, H, V]; beta [B, L, H]; state [B, H, K, V]. Returns o [B, L, H, V] in the state dtype, equal to the
    token loop's up to rounding, or None when the cumulative gate falls below _BLOCK_MIN_CUMGATE (then the caller
    runs the loop; `checked`: the caller knows it cannot, and nothing is read back to test it). Only outputs: the
    committed state is ReplaySSM's fold's job, bit-exact with decode."""
    dt = state.dtype
    q, k, v, g = (t.to(dt).transpose(1, 2) for t in (q, k, v, g))  # [B, H, L, *]
    beta = beta.to(dt).transpose(1, 2).unsqueeze(-1)  # [B, H, L, 1]
    gc = g.cumsum(2)
    if not checked and g.numel() and float(gc.min()) < _BLOCK_MIN_CUMGATE:
        return None
    decay = torch.exp(gc)
    kd, ki, qd = k * decay, k * torch.exp(-gc), q * (scale * decay)  # k_i Gamma_i, k_j Gamma_j^-1, scaled q_i Gamma_i
    eye, upper, strict = _block_masks(k.shape[2], dt, k.device)
    kt = ki.transpose(-1, -2)
    # (I + diag(beta) A) U = diag(beta) (v - kd S0), A_ij = k_i Gamma_i Gamma_j^-1 k_j for j < i; U_j = beta_j u_j
    lower = torch.addcmul(eye, beta, (kd @ kt).masked_fill(upper, 0))
    u = torch.linalg.solve_triangular(lower, beta * (v - kd @ state), upper=False, unitriangular=True)
    o = qd @ state + (qd @ kt).masked_fill(strict, 0) @ u
    return o.transpose(1, 2).contiguous()


def kda_fold(rec: KDAReplay, conv_state, ssm, slots, commit: list[int], snapshots=None) -> None:
    """ReplaySSM: advance each sequence's committed state by its first commit[i] verify steps, in place.

    Replays kda_update with the stored inputs (no recomputed gate or conv), so the result is bit-identical to the
    verify pass's own state after those steps, and to the plain recurrence. snapshots: per sequence None or
    (steps, slot) to also receive the state after `steps` steps (prefix-cache checkpoints inside the window).
    """
    B, L, C = rec.x.shape
    W = conv_state.shape[1] + 1
    window = torch.cat([conv_state[slots].to(rec.x.dtype), rec.x], dim=1)  # [B, W - 1 + L, C]
    snapshots = snapshots or [None] * B
    if rec.states is not None:  # the snapshot baseline: pick the stored state
        idx = torch.tensor([c - 1 for c in commit], device=rec.x.device)
        state = rec.states[torch.arange(B, device=idx.device), idx]
        for i, snap in enumerate(snapshots):
            if snap is not None:
                ssm[snap[1]] = rec.states[i, snap[0] - 1]
    else:
        rows = slot_rows(slots)
        state = ssm[rows]  # a view when rows is a slice (updated in place)
        steps = torch.tensor(commit, device=rec.x.device)
        everyone = min(commit)  # steps every sequence takes: masking by 1 is exact, so it is skipped
        for t in range(max(commit)):
            if t < everyone:
                kda_update(state, rec.k[:, t], rec.v[:, t], rec.g[:, t], rec.beta[:, t])
            else:
                on = (steps > t).to(state.dtype)
                kda_update(state, rec.k[:, t] * on.view(B, 1, 1).to(rec.k.dtype), rec.v[:, t],
                           rec.g[:, t] * on.view(B, 1, 1).to(rec.g.dtype),
                           rec.beta[:, t] * on.view(B, 1).to(rec.beta.dtype))
            for i, snap in enumerate(snapshots):
                if snap is not None and snap[0] == t + 1:
                    ssm[snap[1]] = state[i]
        if isinstance(rows, slice):
            state = None
    if state is not None:
        ssm[slots] = state
    tails = torch.stack([window[i, c : c + W - 1] for i, c in enumerate(commit)])
    conv_state[slots] = tails.to(conv_state.dtype)
    for i, snap in enumerate(snapshots):
        if snap is not None:
            conv_state[snap[1]] = window[i, snap[0] : snap[0] + W - 1].to(conv_state.dtype)


def kda_fold_layers(recs: list[KDAReplay], conv_states: list[torch.Tensor], ssms: list[torch.Tensor], slots,
                    commit: list[int], snapshots=None) -> None:
    """kda_fold for several layers' records over the same slots and commits, as one fold over a batch of layers x
    sequences: the same kda_update steps on the layers' states stacked (the CPU fold is a few dozen small ops a
    layer, so one pass instead of one per layer saves most of them). The stacked recurrence is the per-layer one:
    its elementwise ops are the same, and each [1, K] x [K, V] product of the batched matmul is computed alone
    (`test_fold_of_layers_equals_the_fold_of_each_layer` checks the bits). With snapshots, the snapshot baseline's
    records or layers of unequal shapes, each layer is folded on its own."""
    n = len(recs)
    same = all(r.x.shape == recs[0].x.shape and r.k is not None and r.k.shape == recs[0].k.shape for r in recs)
    same = same and len({(c.shape[1:], c.dtype) for c in conv_states}) == 1
    same = same and len({(t.shape[1:], t.dtype) for t in ssms}) == 1
    if n < 2 or not same or any(s is not None for s in snapshots or []):
        for rec, conv, ssm in zip(recs, conv_states, ssms, strict=True):
            kda_fold(rec, conv, ssm, slots, commit, snapshots)
        return
    B = recs[0].x.shape[0]
    rows = slot_rows(slots)
    cat = lambda name: torch.cat([getattr(r, name) for r in recs])  # noqa: E731  [n * B, L, ...]
    rec = KDAReplay(cat("x"), cat("k"), cat("v"), cat("g"), cat("beta"))
    conv = torch.cat([c[rows] for c in conv_states])  # [n * B, W - 1, C], then the layers' own slots again
    state = torch.cat([t[rows] for t in ssms])
    kda_fold(rec, conv, state, torch.arange(n * B), list(commit) * n)
    for i in range(n):
        conv_states[i][rows] = conv[i * B : (i + 1) * B]
        ssms[i][rows] = state[i * B : (i + 1) * B]
