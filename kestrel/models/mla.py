"""NoPE MLA: latent KV attention without rotary embedding, optional q LoRA and sigmoid output gate."""

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from kestrel.models.config import K3Config
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.models.layers.linear import FusedLinears, Linear
from kestrel.models.layers.norm import RMSNorm
from kestrel.ops import mla as mla_ops
from kestrel.ops.linear import Prologue

# Moonshot's code uses 1e-6 for the latent norms whatever rms_norm_eps says
LATENT_NORM_EPS = 1e-6


class MLAMixer(nn.Module):
    def __init__(self, cfg: K3Config, layer_id: int, dtype=None):
        super().__init__()
        D, H = cfg.hidden_size, cfg.num_attention_heads
        self.layer_id, self.num_heads = layer_id, H
        self.nope, self.rope, self.v_dim, self.rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        qk = self.nope + self.rope
        if cfg.q_lora_rank:
            self.q_a_proj = Linear(D, cfg.q_lora_rank, dtype=dtype)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS, dtype=dtype)
            self.q_b_proj = Linear(cfg.q_lora_rank, H * qk, dtype=dtype)
        else:
            self.q_proj = Linear(D, H * qk, dtype=dtype)
        self.kv_a_proj_with_mqa = Linear(D, self.rank + self.rope, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS, dtype=dtype)
        self.kv_b_proj = Linear(self.rank, H * (self.nope + self.v_dim), dtype=dtype)
        self.kv_b_proj.cpu_kmajor = False  # viewed per head (the absorbed decode), not only multiplied
        self.o_proj = Linear(H * self.v_dim, D, dtype=dtype)
        if cfg.mla_use_output_gate:
            self.g_proj = Linear(D, H * self.v_dim, dtype=dtype)
        self.scale = qk**-0.5

    def query(self, x: torch.Tensor, q_a: torch.Tensor | None = None) -> torch.Tensor:
        if hasattr(self, "q_b_proj"):
            q_a = self.q_a_proj(x) if q_a is None else q_a
            norm = self.q_a_layernorm  # the q LoRA norm inside a one-row GEMV
            q = self.q_b_proj.forward_with(Prologue("rms", q_a, lambda: norm(q_a), weight=norm.weight, eps=norm.eps))
        else:
            q = self.q_proj(x) if q_a is None else q_a
        return q.view(x.shape[0], self.num_heads, self.nope + self.rope)


    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Serve the projections of x (q_a or q, kv_a, output gate) with one GEMM (inference; no memory duplicated)."""
        q = self.q_a_proj if hasattr(self, "q_a_proj") else self.q_proj
        self._fused = FusedLinears(q, self.kv_a_proj_with_mqa, *([self.g_proj] if hasattr(self, "g_proj") else []))

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: the normalised mixer input [T, D]."""
        fused = getattr(self, "_fused", None)
        q_a = kv_a = gate = None
        if fused is not None and fused.valid():
            q_a, kv_a, *rest = fused(x)
            gate = rest[0] if rest else None
        q, latent = self.query(x, q_a), None
        kv_a = self.kv_a_proj_with_mqa(x) if kv_a is None else kv_a
        norm = self.kv_a_layernorm
        if fb.mem is not None:
            # served from the cache: the new tokens' latents go straight into it (one kernel on the GPU)
            buf = fb.mem.kv_buffer(self.layer_id)
            mla_ops.store_latent(kv_a, norm.weight, norm.eps, self.rank, buf, fb.out_cache_loc)
        else:
            latent = mla_ops.latent_entries(kv_a, norm.weight, norm.eps, self.rank)  # [T, rank + rope]
        if fb.mode == ForwardMode.DECODE and fb.mem is not None:
            o = self._decode(q, buf, fb.page_table, fb.seq_lens_tensor())
        elif fb.mode == ForwardMode.VERIFY:
            # every verify token is a query over its own key count, through its block's page-table row
            o = self._decode(q, buf, fb.page_table, fb.verify_key_lens(), verify=True)
        elif (split := fb.split_decode_rows()) is not None:
            # a mixed batch: decode rows in one batched paged decode, prefill rows one sequence at a time
            o = q.new_empty(q.shape[0], self.num_heads, self.v_dim)
            dec, dec_tok = fb.subset(split[0])
            o[dec_tok] = self._decode(q[dec_tok], buf, dec.page_table, dec.seq_lens_tensor())
            ext, ext_tok = fb.subset(split[1])
            o[ext_tok] = self._per_sequence(q[ext_tok], None, ext)
        else:
            o = self._per_sequence(q, latent, fb)
        o = o.reshape(x.shape[0], -1)  # [T, H * v_dim]
        if hasattr(self, "g_proj"):
            g = self.g_proj(x) if gate is None else gate
            # the output gate inside a one-row GEMV
            pro = Prologue("gate", o, lambda: o * torch.sigmoid(g), other=g)
            return self.o_proj.forward_with(pro, late_trigger=True)
        return self.o_proj(o, late_trigger=True)

    def _decode(self, q, buf, page_table, seq_lens, verify: bool = False):
        """Absorbed-form attention of one query token per page-table row over its first seq_lens keys (with
        verify, of equal blocks of query tokens per row, each over its own key count)."""
        w_uk, w_uv = self._kv_b()
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        q_lat = mla_ops.head_gemv(q_nope, w_uk.transpose(1, 2))  # [T, H, rank]: q_nope through W_uk^T
        if not verify:  # [T, H, v_dim]: the latent output through W_uv
            return mla_ops.decode_project(q_lat, q_rope, buf, page_table, seq_lens, self.rank, self.scale, w_uv)
        out_lat = mla_ops.verify_paged(q_lat, q_rope, buf, page_table, seq_lens, self.rank, self.scale)
        return mla_ops.head_gemv(out_lat.to(q.dtype), w_uv)

    def _batched_training(self, q, latent, fb):
        B, L, H = fb.batch_size, fb.extend_lens[0], self.num_heads
        kv = self.kv_b_proj(latent[:, : self.rank]).view(B, L, H, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, latent[:, None, self.rank :].view(B, L, 1, self.rope).expand(B, L, H, self.rope)], -1)
        o = F.scaled_dot_product_attention(q.view(B, L, H, -1).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=self.scale)
        return o.transpose(1, 2).reshape(B * L, H, self.v_dim)

    def _per_sequence(self, q, latent, fb):
        """Each sequence's new tokens over its keys: from latent (this call's tokens) without a cache, else read
        back from the cache."""
        if fb.training and fb.equal_lengths and fb.mem is None:
            return self._batched_training(q, latent, fb)
        cu = fb.cu_seqlens
        buf = fb.mem.kv_buffer(self.layer_id) if fb.mem is not None else None
        # keys per sequence: its cached prefix and new tokens, or only this call's tokens without a cache
        keys = fb.seq_lens if buf is not None else fb.extend_lens
        if fb.batch_size == 1:
            return self._one_sequence(q, latent, fb, 0, buf)
        if q.is_cuda and PACKED_PREFILL:
            return self._packed(q, latent, fb, keys, buf)
        # on the CPU, sequences of similar sizes go through one padded block (a Python loop over a batch of short
        # prompts cost more than their attention)
        groups = ([[i] for i in range(fb.batch_size)] if q.is_cuda
                  else prefill_groups(fb.extend_lens, keys, self.num_heads))
        o = q.new_empty(q.shape[0], self.num_heads, self.v_dim)
        for group in groups:
            if len(group) == 1:
                i = group[0]
                o[cu[i] : cu[i + 1]] = self._one_sequence(q, latent, fb, i, buf)
            else:
                rows, out = self._padded(q, latent, fb, group, keys, buf)
                o[rows] = out
        return o

    def _one_sequence(self, q, latent, fb, i: int, buf):
        a, b = fb.cu_seqlens[i], fb.cu_seqlens[i + 1]
        if buf is None:
            lat = latent[a:b]
        else:
            lat = mla_ops.gather_latents(buf, fb.page_table[i], fb.prefix_lens[i] + b - a).to(q.dtype)
        return self._expanded(q[a:b], lat, fb.prefix_lens[i])[0]

    def _packed(self, q, latent, fb, keys: list[int], buf):
        """Every sequence's new tokens over its keys in one varlen attention launch (GPU): the keys of all
        sequences gathered back to back (from the cache through each page-table row, or this call's latents) and
        expanded by one kv_b_proj GEMM, where the per-sequence loop costs ~8 launches a sequence."""
        H = self.num_heads
        # no cache: the keys are this call's tokens, packed as the queries are
        lat = latent if buf is None else mla_ops.gather_packed_latents(buf, fb.page_table, keys).to(q.dtype)
        S = lat.shape[0]
        kv = self.kv_b_proj(lat[:, : self.rank]).view(S, H, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, lat[:, None, self.rank :].expand(S, H, self.rope)], dim=-1)
        cu_k = list(itertools.accumulate(keys, initial=0))
        return mla_ops.attention_varlen(q, k, v, self.scale, fb.cu_seqlens, cu_k, fb.prefix_lens)[0]

    def _padded(self, q, latent, fb, group: list[int], keys: list[int], buf):
        """The sequences of `group` as one padded block: (the packed rows of their tokens, their outputs)."""
        dev, H = q.device, self.num_heads
        ext, pre, key_lens, starts = (torch.tensor([xs[i] for i in group], device=dev)
                                      for xs in (fb.extend_lens, fb.prefix_lens, keys, fb.cu_seqlens))
        Lq, S = int(ext.max()), int(key_lens.max())
        j = torch.arange(Lq, device=dev)[None, :]
        qrows = starts[:, None] + torch.minimum(j, ext[:, None] - 1)  # padding rows repeat the last token
        pos = torch.arange(S, device=dev)[None, :]
        pos = torch.where(pos < key_lens[:, None], pos, 0)  # past a sequence's keys: its first (finite) row
        if buf is None:
            lat = latent[starts[:, None] + pos]
        else:
            ps = buf.shape[1]
            pages = fb.page_table[group].long().gather(1, pos // ps)
            lat = buf[pages, pos % ps].to(q.dtype)  # [n, S, rank + rope]
        n = len(group)
        kv = self.kv_b_proj(lat[..., : self.rank]).view(n, S, H, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, lat[:, :, None, self.rank :].expand(n, S, H, self.rope)], dim=-1)
        out = mla_ops.attention_padded(q[qrows], k, v, self.scale, pre)
        valid = j < ext[:, None]
        return qrows[valid], out[valid]

    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj split per head into W_uk [H, nope, rank] and W_uv [H, v_dim, rank]."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def _expanded(self, q, lat, q_offset: int):
        S, H = lat.shape[0], self.num_heads
        kv = self.kv_b_proj(lat[:, : self.rank]).view(S, H, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, lat[:, None, self.rank :].expand(S, H, self.rope)], dim=-1)
        return mla_ops.attention(q, k, v, self.scale, q_offset)


# off: a GPU prefill of several sequences runs their attention one sequence at a time
PACKED_PREFILL = True


def prefill_groups(ext: list[int], keys: list[int], heads: int, cap: int = 1 << 24) -> list[list[int]]:
    """Sequences (indices) grouped for padded prefill attention: in order of key count, a sequence joins the group
    being built while the group's padded score block (members x longest query x most keys x heads) stays within
    1.25x of its members' own blocks and `cap` elements."""
    groups: list[list[int]] = []
    cur, real, lq = [], 0, 0
    for i in sorted(range(len(ext)), key=lambda i: (keys[i], ext[i])):
        cost = ext[i] * keys[i]
        if cur:
            lq_new = max(lq, ext[i])
            padded = (len(cur) + 1) * lq_new * keys[i]
            if padded <= 1.25 * (real + cost) and padded * heads <= cap:
                cur.append(i)
                real, lq = real + cost, lq_new
                continue
            groups.append(cur)
        cur, real, lq = [i], cost, ext[i]
    if cur:
        groups.append(cur)
    return groups
