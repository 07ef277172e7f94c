"""FFNs: dense SiTU/SiLU MLP, and (Latent)MoE with a sigmoid router, routed experts and shared experts."""

import torch
from torch import nn

from kestrel.models.config import K3Config
from kestrel.models.layers.linear import ExpertWeights, FusedLinears, Linear, linear_pair
from kestrel.models.layers.norm import RMSNorm
from kestrel.ops import linear as linear_ops
from kestrel.ops import moe as moe_ops
from kestrel.ops.moe import Activation


def activation(cfg: K3Config) -> Activation:
    """act(gate, up): SiTU with the config's betas, or SwiGLU's silu(gate) * up."""
    return Activation(cfg.hidden_act, cfg.activation_situ_beta, cfg.activation_situ_linear_beta)


class DenseFFN(nn.Module):
    def __init__(self, hidden: int, inter: int, act, dtype=None):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, dtype=dtype)
        self.up_proj = Linear(hidden, inter, dtype=dtype)
        self.down_proj = Linear(inter, hidden, dtype=dtype)
        self.act = act
        # set by a parent whose fused GEMM already serves gate and up (the MoE front end): no fusion of our own, which
        # would move those weights out of the parent's buffer (and leave its fusion invalid)
        self.fused_by_parent = False

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """gate and up projections as one GEMM (inference; no memory duplicated)."""
        if not self.fused_by_parent:
            self._fused = FusedLinears(self.gate_proj, self.up_proj)

    def down_input(self, x: torch.Tensor,
                   gate_up: tuple[torch.Tensor, torch.Tensor] | None = None) -> linear_ops.Prologue:
        """The down projection's input act(gate, up) as a prologue (see forward for gate_up)."""
        fused = getattr(self, "_fused", None)
        if gate_up is None and fused is not None and fused.valid():
            gate_up = fused(x)
        a, b = gate_up if gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return linear_ops.Prologue("act", a, lambda: moe_ops.activate(self.act, a, b), other=b, act=self.act)

    def forward(self, x: torch.Tensor, gate_up: tuple[torch.Tensor, torch.Tensor] | None = None,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """gate_up: the two input projections when a caller already computed them (a fused front-end GEMM); add: a
        residual summed into the output (by the down projection's epilogue on GPU)."""
        # the activation inside a one-row GEMV; the FFN's last kernel lets its dependents launch late (K3Model)
        return self.down_proj.forward_with(self.down_input(x, gate_up), add, late_trigger=True)


class Router(nn.Module):
    """Sigmoid router; weight [E, D] and correction bias [E] kept in fp32."""

    def __init__(self, cfg: K3Config, dtype=None):
        super().__init__()
        fp = torch.float64 if dtype == torch.float64 else torch.float32
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, dtype=fp))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts, dtype=fp))
        self.cfg = cfg

    def routing(self) -> moe_ops.Routing:
        c = self.cfg
        return moe_ops.Routing(self.e_score_correction_bias, c.num_experts_per_token, c.moe_renormalize,
                               c.routed_scaling_factor, c.num_expert_group, c.topk_group)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return linear_ops.linear(x, self.weight)  # fp32 logits

    def forward(self, x: torch.Tensor, logits: torch.Tensor | None = None):
        """(weights, ids) of the chosen experts; logits: x's, when the caller computed them."""
        r = self.routing()
        return moe_ops.route(self.logits(x) if logits is None else logits, r.correction_bias, r.top_k, r.renormalize,
                             r.scaling, r.num_expert_group, r.topk_group)


class MoE(nn.Module):
    """out = W_up RMSNorm_latent(sum_e w_e E_e(W_down x)) + Shared(x); without latent fields, plain Kimi-Linear MoE."""

    def __init__(self, cfg: K3Config, dtype=None):
        super().__init__()
        D, latent = cfg.hidden_size, cfg.routed_expert_hidden_size
        self.act = activation(cfg)
        self.gate = Router(cfg, dtype)
        quantized = cfg.quantization is not None
        self.experts = ExpertWeights(cfg.num_experts, latent or D, cfg.moe_intermediate_size, quantized, dtype)
        if latent:
            self.routed_expert_down_proj = Linear(D, latent, dtype=dtype)
            self.routed_expert_up_proj = Linear(latent, D, dtype=dtype)
            if cfg.latent_moe_use_norm:
                self.routed_expert_norm = RMSNorm(latent, cfg.rms_norm_eps, dtype=dtype)
        if cfg.num_shared_experts:
            self.shared_experts = DenseFFN(D, cfg.moe_intermediate_size * cfg.num_shared_experts, self.act, dtype)

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """The latent down projection and the shared experts' gate and up as one GEMM (the MoE front end)."""
        if hasattr(self, "routed_expert_down_proj") and hasattr(self, "shared_experts"):
            se = self.shared_experts
            self._fused = FusedLinears(self.routed_expert_down_proj, se.gate_proj, se.up_proj)
            se.fused_by_parent = True

    def forward(self, x: torch.Tensor, training: bool = False) -> torch.Tensor:
        fused = getattr(self, "_fused", None)
        fused = fused if fused is not None and fused.valid() else None
        latent, shared = hasattr(self, "routed_expert_up_proj"), hasattr(self, "shared_experts")
        # CUDA inference: the shared experts on a second stream, beside the routed path (moe_ops.side_stream); the
        # routed up projection then adds their output in its epilogue (the sum commutes: the same bits)
        beside = moe_ops.side_stream(x) if latent and shared and not training else None
        if beside is not None:
            main = torch.cuda.current_stream(x.device)
            beside.wait_stream(main)
            with torch.cuda.stream(beside):
                shared_y = self.shared_experts(x, fused.part(x, 1, 3) if fused is not None else None)
        logits = self.gate.logits(x)  # routing reads x, not the latent
        routing = self.gate.routing()
        # routed now, before the front end's late-trigger GEMM, unless the expert kernels choose the experts
        # themselves (the expert kernels may read the routing before their wait: it must be finished by then)
        chosen = None if moe_ops.routes_in_experts(logits, routing) else self.gate(x, logits)
        shared_in, ids_ready = None, False
        if fused is not None:
            # launched so that the router has finished before the expert kernels can start: they then choose the
            # experts and stream their weights while this GEMM runs
            if beside is not None:
                h, = fused.part(x, 0, 1, late_trigger=True)
            else:
                h, *shared_in = fused(x, late_trigger=True)
            ids_ready = True
        else:
            h = self.routed_expert_down_proj(x) if latent else x
        last = not shared  # which kernel ends the MoE (launches its dependents late)
        # the shared experts' act(gate, up) computed by the routed experts' up GEMV for the paired tail below
        norm = getattr(self, "routed_expert_norm", None)
        side = shared_in if moe_ops.SHARED_ACT_IN_EXPERTS and norm is not None and not last and not training else None
        if training:
            # every expert on every token, weighted (zero where not routed): more FLOPs, no host syncs
            weights, ids = chosen if chosen is not None else self.gate(x, logits)
            e = self.experts
            y = moe_ops.experts_dense(h, e.dense("w1", h.dtype), e.dense("w2", h.dtype), e.dense("w3", h.dtype),
                                      weights, ids, self.act)
        else:
            late = not latent and last
            if chosen is None:  # the routing inside the expert kernels (one launch fewer)
                y = moe_ops.experts_routed(h, self.experts, logits, routing, self.act, ids_ready, late_trigger=late,
                                           shared=side)
            else:
                y = moe_ops.experts(h, self.experts, *chosen, self.act, ids_ready, late_trigger=late, shared=side)
            if side is not None:
                y, shared_act = y
        if beside is not None:
            # the join: the up projection below reads the shared experts' output. shared_y belongs to the side
            # stream's pool; it is freed before the next layer's fork, after which the side stream waits for the
            # main one, so its memory is not reused while the main stream may still read it
            main.wait_stream(beside)
            last, add = True, shared_y
        else:
            add = None
        if latent:
            if norm is not None:  # the latent norm inside a one-row GEMV
                y0 = y
                pro = linear_ops.Prologue("rms", y0, lambda: norm(y0), weight=norm.weight, eps=norm.eps)
                if not last:  # the latent up projection and the shared experts' down projection: one launch
                    se = self.shared_experts
                    if side is not None and shared_act is not None:
                        down_in = linear_ops.Prologue("none", shared_act, lambda: shared_act)
                    else:
                        down_in = se.down_input(x, shared_in)
                    return linear_pair(self.routed_expert_up_proj, pro, se.down_proj, down_in, late_trigger=True)
                y = self.routed_expert_up_proj.forward_with(pro, add, late_trigger=last)
            else:
                y = self.routed_expert_up_proj(y, add, late_trigger=last)
        if shared and beside is None:
            y = self.shared_experts(x, shared_in, add=y)  # shared + routed: the add rides the down projection
        return y
