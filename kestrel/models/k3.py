"""The K3 family decoder: KDA / MLA layers, dense FFN or (Latent)MoE, optional block attention residuals.

One class covers `kimi_linear` checkpoints and the K3 extensions; config fields switch the extensions on.
Layers read their caches through the ForwardBatch (`fb.mem`), so the same forward serves the stateless reference,
packed prefill, extend from a cached prefix, and decode.
"""

from dataclasses import dataclass

import torch
from torch import nn

from kestrel.models.config import K3Config
from kestrel.models.forward_batch import ForwardBatch
from kestrel.models.kda import KDAMixer
from kestrel.models.layers.linear import Linear
from kestrel.models.layers.norm import RMSNorm
from kestrel.models.mla import MLAMixer
from kestrel.models.moe import MoE, DenseFFN, activation
from kestrel.ops import reference_ops
from kestrel.ops.attn_res import attn_res, attn_res_settle
from kestrel.ops import norm as norm_ops
from kestrel.ops.norm import add_rms_norm


class AttnResSite(nn.Module):
    """One aggregation site. Checkpoints store an RMSNorm weight [D] and a projection [1, D] (`*_res_norm`,
    `*_res_proj`); since the key is <RMSNorm(V) * norm_weight, proj>, the two fold into one vector w."""

    def __init__(self, dim: int, dtype=None):
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.proj_weight = nn.Parameter(torch.zeros(1, dim, dtype=dtype))

    def vector(self) -> torch.Tensor:
        return self.norm_weight * self.proj_weight[0]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: K3Config, layer_id: int, dtype=None):
        super().__init__()
        D = cfg.hidden_size
        self.layer_id = layer_id
        self.is_kda = cfg.is_kda(layer_id)
        self.self_attn = KDAMixer(cfg, layer_id, dtype) if self.is_kda else MLAMixer(cfg, layer_id, dtype)
        if cfg.is_moe(layer_id):
            self.block_sparse_moe = MoE(cfg, dtype)
        else:
            self.mlp = DenseFFN(D, cfg.intermediate_size, activation(cfg), dtype)
        self.input_layernorm = RMSNorm(D, cfg.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(D, cfg.rms_norm_eps, dtype=dtype)
        if cfg.attn_res_block_size:
            self.attn_res = AttnResSite(D, dtype)
            self.mlp_res = AttnResSite(D, dtype)

    def ffn(self, x: torch.Tensor, training: bool = False) -> torch.Tensor:
        return self.block_sparse_moe(x, training) if hasattr(self, "block_sparse_moe") else self.mlp(x)


# off: the embedding lookup and the first layer's input norm as two ops (two launches on a GPU)
FUSED_EMBED = True


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [N, vocab] for fb.logits_indices (or every token)
    hidden: torch.Tensor  # [T, D] final normed hidden states of every token
    captured: dict[int, torch.Tensor]  # layer id -> that layer's output (the residual stream) [T, D]


class K3Model(nn.Module):
    def __init__(self, cfg: K3Config, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        if cfg.attn_res_block_size:
            self.output_attn_res = AttnResSite(cfg.hidden_size, dtype)

    def aggregate(self, site: AttnResSite, bank: list[torch.Tensor], partial: torch.Tensor) -> torch.Tensor:
        return attn_res(bank + [partial], site.vector(), self.cfg.rms_norm_eps)

    def _settle(self, site, norm: RMSNorm, bank, partial, delta):
        """Apply the pending sublayer output `delta` to the stream and pre-norm the next sublayer's input, fused on
        GPU: AttnRes aggregation + RMSNorm, or residual add + RMSNorm. Returns (partial, normed input)."""
        if site is not None and bank:
            # every sublayer's last kernel launches its dependents only after its own wait (late_trigger), so the
            # settle may read the bank and the partial sum before it waits for delta
            return attn_res_settle(bank, partial, delta, site.norm_weight, site.proj_weight[0], self.cfg.rms_norm_eps,
                                   norm.weight, norm.eps, early=delta is not None)
        if delta is not None:
            if site is None:
                return add_rms_norm(partial, delta, norm.weight, norm.eps)
            partial = delta if partial is None else partial + delta
        return partial, norm(partial)

    def forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        block = self.cfg.attn_res_block_size
        # partial sum P and bank B of completed block sums; without AttnRes, P is the plain residual stream.
        # `delta` is a sublayer output not yet added to P (added inside the next fused settle); P = None is zero.
        first = self.layers[0].input_layernorm
        if FUSED_EMBED:  # the embeddings and the first layer's normed input (one kernel on a GPU)
            partial, x = norm_ops.embed_rms_norm(fb.input_ids, self.embed_tokens.weight, first.weight, first.eps)
        else:
            partial = self.embed_tokens(fb.input_ids)
            x = first(partial)
        delta = None
        bank: list[torch.Tensor] = []
        captured = {}
        # a captured layer's output P + delta: the next settle writes it as its partial sum (no add of its own)
        pending = None
        for l, layer in enumerate(self.layers):
            if l:
                partial, x = self._settle(layer.attn_res if block else None, layer.input_layernorm, bank, partial,
                                          delta)
            if pending is not None:
                captured[pending], pending = partial, None
            if block and l % block == 0:
                bank.append(partial)
                partial = None
            delta = layer.self_attn(x, fb)
            partial, y = self._settle(layer.mlp_res if block else None, layer.post_attention_layernorm, bank, partial,
                                      delta)
            delta = layer.ffn(y, fb.training)
            if l in fb.capture_layers:
                pending = l
        partial, h = self._settle(self.output_attn_res if block else None, self.norm, bank, partial, delta)
        if pending is not None:
            captured[pending] = partial
        return h, captured

    def fuse_projections(self) -> None:
        """One GEMM per group of projections that read the same input (inference; see FusedLinears)."""
        for m in self.modules():
            if m is not self and hasattr(m, "fuse_projections"):
                m.fuse_projections()


class K3ForCausalLM(nn.Module):
    def __init__(self, cfg: K3Config, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype or torch.float32
        self.model = K3Model(cfg, dtype)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        self.model.fuse_projections()

    def forward(self, fb: ForwardBatch) -> ModelOutput:
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            # autograd is recording a trainable model: the differentiable reference ops (the Triton kernels have no
            # backward, so a gradient through them would be lost without a word). Serving runs in inference mode.
            with reference_ops():
                return self._forward(fb)
        return self._forward(fb)

    def _forward(self, fb: ForwardBatch) -> ModelOutput:
        hidden, captured = self.model(fb)
        rows = hidden if fb.logits_indices is None else hidden[fb.logits_indices]
        return ModelOutput(self.lm_head(rows), hidden, captured)

    @torch.no_grad()
    def reference_logits(self, tokens: list[int] | torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """The single-request full-forward reference: logits [len, vocab] of one whole sequence, no cache
        (with last_only, just the last position's [1, vocab])."""
        device = self.lm_head.weight.device
        fb = ForwardBatch.full_sequences([list(map(int, tokens))], device=device)
        if last_only:
            fb.logits_indices = torch.tensor([len(tokens) - 1], device=device)
        return self(fb).logits

    def logits_train(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B, T, vocab] with autograd (the stateless path over equal-length sequences)."""
        B, T = input_ids.shape
        fb = ForwardBatch.full_sequences(input_ids, device=input_ids.device)
        fb.training = True
        return self(fb).logits.view(B, T, -1)
