"""The KDA (Kimi Delta Attention) mixer: short convs, L2-normalised q/k, per-channel decay, delta-rule state."""

import torch
from torch import nn

from kestrel.models.config import K3Config
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.models.layers.linear import FusedLinears, Linear, StackedLinears
from kestrel.models.layers.norm import RMSNorm
from kestrel.ops import host_ints
from kestrel.ops import kda as kda_ops
from kestrel.ops.linear import Prologue
from kestrel.ops.norm import gated_rms_norm


class ShortConv(nn.Module):
    """Depthwise causal conv weight [channels, 1, width], stored as in checkpoints (`{q,k,v}_conv1d.weight`)."""

    def __init__(self, channels: int, width: int, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width, dtype=dtype))


class KDAMixer(nn.Module):
    def __init__(self, cfg: K3Config, layer_id: int, dtype=None):
        super().__init__()
        D, H, K = cfg.hidden_size, cfg.linear_num_heads, cfg.linear_head_dim
        self.layer_id, self.num_heads, self.head_dim = layer_id, H, K
        self.lower_bound = cfg.gate_lower_bound
        self.eps = cfg.rms_norm_eps
        state_dt = kda_ops.state_dtype_for(dtype or torch.float32)
        self.q_proj, self.k_proj, self.v_proj = (Linear(D, H * K, dtype=dtype) for _ in range(3))
        W = cfg.short_conv_kernel_size
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (ShortConv(H * K, W, dtype) for _ in range(3))
        # per-head decay rate and per-channel gate bias stay in fp32 (fp64 in exactness runs)
        self.A_log = nn.Parameter(torch.empty(H, dtype=state_dt))
        self.dt_bias = nn.Parameter(torch.empty(H * K, dtype=state_dt))
        self.f_a_proj = Linear(D, K, dtype=dtype)
        self.f_b_proj = Linear(K, H * K, dtype=dtype)
        self.b_proj = Linear(D, H, dtype=dtype)
        if cfg.use_full_rank_gate:
            self.g_proj = Linear(D, H * K, dtype=dtype)
        else:
            self.g_a_proj = Linear(D, K, dtype=dtype)
            self.g_b_proj = Linear(K, H * K, dtype=dtype)
        self.o_norm = RMSNorm(K, cfg.rms_norm_eps, dtype=dtype)
        self.o_proj = Linear(H * K, D, dtype=dtype)

    def conv_weight(self) -> torch.Tensor:
        """[3 * H * K, W] for q, k, v channels in that order (the conv-state channel order)."""
        fused = getattr(self, "_fused_conv", None)
        if fused is not None and [c.weight.data_ptr() for c in self._convs()] == fused[1]:
            return fused[0]
        return torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight]).squeeze(1)

    def _convs(self):
        return self.q_conv1d, self.k_conv1d, self.v_conv1d

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "g_proj"):
            return self.g_proj(x)
        return self.g_b_proj(self.g_a_proj(x))

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Serve the six projections of x (q, k, v, gate, f_a, b) with one GEMM and the three conv weights without
        a per-call cat (inference only: the weights become views of shared buffers, no memory is duplicated)."""
        gate = self.g_proj if hasattr(self, "g_proj") else self.g_a_proj
        self._fused = FusedLinears(self.q_proj, self.k_proj, self.v_proj, gate, self.f_a_proj, self.b_proj)
        if not hasattr(self, "g_proj"):  # the two bottleneck up-projections read adjacent columns: one launch
            self._fused_up = StackedLinears(self.g_b_proj, self.f_b_proj)
        buf = torch.cat([c.weight.data for c in self._convs()])
        for c, part in zip(self._convs(), buf.split(self.num_heads * self.head_dim)):
            c.weight.data = part
        self._fused_conv = (buf.squeeze(1), [c.weight.data_ptr() for c in self._convs()])

    def _project(self, x: torch.Tensor):
        """mixed [T, 3HK], raw gate [T, H, K], beta's logits [T, H] and the output gate's input projection."""
        T, H, K = x.shape[0], self.num_heads, self.head_dim
        fused = getattr(self, "_fused", None)
        if fused is not None and fused.valid():
            q, k, v, gate, fa, b = fused(x)
            mixed = torch.cat([q, k, v], dim=-1) if x.requires_grad else fused_slice(q, v)
            up = getattr(self, "_fused_up", None)
            if up is not None and up.valid() and not x.requires_grad:
                gate, raw_gate = up(fused_slice(gate, fa))
                return mixed, raw_gate.view(T, H, K), b, gate
        else:
            mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
            fa, b, gate = self.f_a_proj(x), self.b_proj(x), None
        raw_gate = self.f_b_proj(fa).view(T, H, K)
        if gate is None:
            gate = self.output_gate(x)
        elif not hasattr(self, "g_proj"):
            gate = self.g_b_proj(gate)
        return mixed, raw_gate, b, gate

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: the normalised mixer input [T, D]."""
        T, H, K = x.shape[0], self.num_heads, self.head_dim
        mixed, raw_gate, b, gate = self._project(x)  # beta = sigmoid(b): inside the decode and verify kernels
        sg = None  # sigmoid(gate) in fp32, where the decode computed it
        if fb.mode == ForwardMode.DECODE and fb.mem is not None:
            if kda_ops.OUT_GATE_IN_RECUR:
                o, sg = self._decode(mixed, raw_gate, b, fb, out_gate=gate.reshape(T, H * K))
            else:
                o = self._decode(mixed, raw_gate, b, fb)
        elif fb.mode == ForwardMode.EXTEND and (split := fb.split_decode_rows()) is not None:
            # a mixed batch: decode rows through the decode kernel, prefill rows through the chunked path
            o = torch.empty(T, H, self.head_dim, dtype=mixed.dtype, device=mixed.device)
            dec, dec_tok = fb.subset(split[0])
            o[dec_tok] = self._decode(mixed[dec_tok], raw_gate[dec_tok], b[dec_tok], dec)
            ext, ext_tok = fb.subset(split[1])
            g = kda_ops.kda_gate(raw_gate[ext_tok], self.A_log, self.dt_bias, self.lower_bound)
            o[ext_tok] = self._extend(mixed[ext_tok], g, kda_ops.beta_from_logits(b[ext_tok], x.dtype), ext)
        elif fb.mode == ForwardMode.EXTEND:
            g = kda_ops.kda_gate(raw_gate, self.A_log, self.dt_bias, self.lower_bound)
            beta = kda_ops.beta_from_logits(b, x.dtype)
            o = self._stateless(mixed, g, beta, fb) if fb.mem is None else self._extend(mixed, g, beta, fb)
        else:
            o = self._verify(mixed, raw_gate, b, fb)
        g, w = gate.reshape(T, H * K), self.o_norm.weight
        kind, other = ("gated_rms", g) if sg is None else ("gated_rms_sig", sg)
        pro = Prologue(kind, o.reshape(T, H * K), other=other, weight=w, eps=self.eps, group=K,
                       apply=lambda: gated_rms_norm(o, g.view(T, H, K), w, self.eps).reshape(T, H * K))
        return self.o_proj.forward_with(pro, late_trigger=True)  # the output norm inside a one-row GEMV

    def _qkv(self, y: torch.Tensor):
        """Conv output [..., 3HK] -> q, k normalised [..., H, K] and v [..., H, K]."""
        H, K = self.num_heads, self.head_dim
        q, k, v = y.view(*y.shape[:-1], 3, H, K).unbind(-3)
        return kda_ops.l2norm(q), kda_ops.l2norm(k), v

    def _stateless(self, mixed, g, beta, fb):
        cu = fb.cu_seqlens
        w = self.conv_weight()
        if fb.training and fb.equal_lengths and self.lower_bound is not None:
            B, L = fb.batch_size, fb.extend_lens[0]
            q, k, v = self._qkv(kda_ops.causal_conv1d(mixed.view(B, L, -1), w, None)[0])
            o = kda_ops.chunked_factored(q, k, v, g.view(B, L, *g.shape[1:]), beta.view(B, L, -1),
                                        min_gate=self.lower_bound)
            return o.reshape(B * L, *o.shape[2:])
        y = torch.cat([kda_ops.causal_conv1d(mixed[None, a:b], w, None)[0][0] for a, b in zip(cu[:-1], cu[1:])])
        q, k, v = self._qkv(y)
        o, _ = kda_ops.chunked(q, k, v, g, beta, cu_seqlens=cu)
        return o

    def _extend(self, mixed, g, beta, fb):
        conv_state, ssm = fb.mem.conv_state(self.layer_id), fb.mem.ssm_state(self.layer_id)
        slots = fb.state_slots
        cu = fb.cu_seqlens
        has_state = host_ints([p > 0 for p in fb.prefix_lens], ssm.device, torch.bool)
        # a sequence with nothing cached starts from zeros: its slot may hold anything (NaN in tests)
        tails = torch.where(has_state.view(-1, 1, 1), conv_state[slots], torch.zeros((), dtype=conv_state.dtype,
                                                                                     device=ssm.device))
        conv = kda_ops.PackedConvWindows(mixed, cu, self.conv_weight(), tails)
        q, k, v = self._qkv(conv.y)
        init = torch.where(has_state.view(-1, 1, 1, 1), ssm[slots], torch.zeros((), dtype=ssm.dtype, device=ssm.device))
        tracked = fb.track is not None and any(t is not None for t in fb.track)
        res = kda_ops.chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=init,
                              start_positions=fb.prefix_lens, output_chunk_states=tracked)
        o, final = res[0], res[1]
        conv_state[slots] = conv.rows(list(range(len(cu) - 1)), fb.extend_lens).to(conv_state.dtype)
        ssm[slots] = final.to(ssm.dtype)
        if tracked:
            for i, t in enumerate(fb.track):
                if t is None:
                    continue
                off, dst = t
                positions, states = res[2][i]
                at = positions.index(fb.prefix_lens[i] + off)
                ssm[dst] = states[at].to(ssm.dtype)
                conv_state[dst] = conv.rows([i], [off])[0].to(conv_state.dtype)
        return o

    def _verify(self, mixed, raw_gate, b, fb):
        """Speculative verify of equal-length padded blocks: the committed state is read, not written; the step
        inputs go to fb.replay for the fold."""
        B, L = fb.batch_size, fb.extend_lens[0]
        lens = fb.verify_lens_t if fb.verify_lens_t is not None else fb.extend_lens
        o, rec = kda_ops.verify(mixed.view(B, L, -1), raw_gate.view(B, L, *raw_gate.shape[1:]), b.view(B, L, -1),
                                lens, self.conv_weight(), fb.mem.conv_state(self.layer_id),
                                fb.mem.ssm_state(self.layer_id), fb.state_slots, self.A_log, self.dt_bias,
                                self.lower_bound, self.head_dim**-0.5, snapshot_states=fb.spec_rollback == "snapshot",
                                beta_logits=True)
        fb.replay[self.layer_id] = rec
        return o.view(B * L, *o.shape[2:])

    def _decode(self, mixed, raw_gate, b, fb, out_gate=None):
        return kda_ops.decode(mixed, self.conv_weight(), fb.mem.conv_state(self.layer_id),
                              fb.mem.ssm_state(self.layer_id), fb.state_slots, raw_gate, self.A_log, self.dt_bias,
                              self.lower_bound, b, self.head_dim**-0.5, beta_logits=True, out_gate=out_gate)


def fused_slice(first: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The columns from `first` to `last` of one GEMM output as a strided view (rows keep the output's stride)."""
    base = first.storage_offset()
    width = last.storage_offset() + last.shape[-1] - base
    return first.as_strided((first.shape[0], width), (first.stride(0), 1), base)
