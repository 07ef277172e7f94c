"""Plain-torch attention for NoPE MLA over a paged latent cache, returning per-head log-sum-exp.

The cache holds, per token and MLA layer, the normalised latent c = [c_kv (R) | k_r (Dr)]. Two equivalent forms:
- expanded (prefill): k = [W_uk c_kv | k_r], v = W_uv c_kv per head, ordinary attention;
- absorbed (decode): q_lat = W_uk^T q_nope, scores = q_lat . c_kv + q_r . k_r, out_lat = sum p c_kv, out = W_uv out_lat.
The log-sum-exp lets partial results over disjoint key sets be merged exactly (decode context parallelism).
"""

import itertools

import torch

from kestrel.ops import host_ints


def store_latent(kv_a: torch.Tensor, weight: torch.Tensor, eps: float, rank: int, kv_buffer: torch.Tensor,
                 loc: torch.Tensor) -> None:
    """Write each token's cache entry [RMSNorm(c_kv) | k_r] (kv_a = [c_kv | k_r], [T, rank + rope]) into the paged
    latent cache kv_buffer [P, page_size, rank + rope] at flat slots loc [T] (page loc // page_size)."""
    ps = kv_buffer.shape[1]
    kv_buffer[loc // ps, loc % ps] = latent_entries(kv_a, weight, eps, rank).to(kv_buffer.dtype)


def latent_entries(kv_a: torch.Tensor, weight: torch.Tensor, eps: float, rank: int) -> torch.Tensor:
    """What the cache holds per token: [RMSNorm(c_kv) | k_r] from kv_a = [c_kv | k_r], [T, rank + rope]."""
    from kestrel.ops.norm import rms_norm
    c_kv, k_r = kv_a.split([rank, kv_a.shape[-1] - rank], dim=-1)
    return torch.cat([rms_norm(c_kv, weight, eps), k_r], dim=-1)


def head_gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-head matrix-vector products y[t, h] = w[h] @ x[t, h]: x [T, H, K], w [H, N, K] -> [T, H, N] (MLA's
    absorbed projections: q_nope through W_uk^T, the latent output through W_uv)."""
    return torch.einsum("thk,hnk->thn", x, w)


def gather_latents(kv_cache: torch.Tensor, page_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """kv_cache [num_pages, page_size, D] -> the sequence's latents [seq_len, D]."""
    page_size = kv_cache.shape[1]
    pos = torch.arange(seq_len, device=page_table_row.device)
    # (page, offset) indexing works on strided views (the unified pool) as well as on contiguous buffers
    return kv_cache[page_table_row[pos // page_size].long(), pos % page_size]


def gather_packed_latents(kv_cache: torch.Tensor, page_table: torch.Tensor, keys: list[int]) -> torch.Tensor:
    """gather_latents of every row of page_table ([N, max_pages]) for its first keys[i] positions, packed back to
    back in one index: [sum(keys), D]."""
    dev, page_size = page_table.device, kv_cache.shape[1]
    total = sum(keys)
    seq = torch.repeat_interleave(torch.arange(len(keys), device=dev), host_ints(keys, dev), output_size=total)
    starts = host_ints(list(itertools.accumulate(keys, initial=0))[:-1], dev)
    pos = torch.arange(total, device=dev) - starts[seq]
    return kv_cache[page_table[seq, pos // page_size].long(), pos % page_size]


def attention_with_lse(q, k, v, scale: float, q_offset: int, causal: bool = True):
    """q [Tq, H, Dk] at absolute positions q_offset.. ; k [S, H, Dk], v [S, H, Dv] at positions 0..S-1.

    Returns out [Tq, H, Dv] and lse [Tq, H] (natural log), computed in at least fp32.
    """
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.einsum("qhd,shd->hqs", q.to(dt), k.to(dt)) * scale
    if causal:
        qpos = torch.arange(q.shape[0], device=q.device) + q_offset
        kpos = torch.arange(k.shape[0], device=q.device)
        s = s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, Tq]
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.einsum("hqs,shd->qhd", p, v.to(dt))
    return out.to(q.dtype), lse.transpose(0, 1)


def attention_varlen_with_lse(q, k, v, scale: float, cu_q: list[int], cu_k: list[int], q_offsets: list[int],
                              causal: bool = True):
    """attention_with_lse of packed sequences: sequence i's queries are rows cu_q[i]..cu_q[i + 1] of q [T, H, Dk]
    at positions q_offsets[i].., its keys rows cu_k[i]..cu_k[i + 1] of k and v at positions 0... Returns out
    [T, H, Dv] and lse [T, H]."""
    parts = [attention_with_lse(q[a:b], k[c:d], v[c:d], scale, off, causal)
             for a, b, c, d, off in zip(cu_q, cu_q[1:], cu_k, cu_k[1:], q_offsets)]
    if not parts:
        return q.new_empty(0, q.shape[1], v.shape[-1]), q.new_empty(0, q.shape[1], dtype=torch.float32)
    return torch.cat([o for o, _ in parts]), torch.cat([l for _, l in parts])


def attention_padded(q, k, v, scale: float, q_offsets: torch.Tensor):
    """attention_with_lse for n sequences padded into one block: q [n, Lq, H, Dk] at positions q_offsets[i]..,
    k [n, S, H, Dk], v [n, S, H, Dv], causal. A sequence's own query rows see only its keys (none lies past its
    last query); its padding keys must still be finite (a masked weight is exactly 0, and 0 x NaN is NaN). Query
    rows past a sequence's own are computed and meant to be dropped. Returns out [n, Lq, H, Dv]."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.einsum("nqhd,nshd->nhqs", q.to(dt), k.to(dt)) * scale
    qpos = torch.arange(q.shape[1], device=q.device)[None, :] + q_offsets.view(-1, 1)  # [n, Lq]
    kpos = torch.arange(k.shape[1], device=q.device)
    s = s.masked_fill((kpos[None, None, :] > qpos[:, :, None])[:, None], float("-inf"))
    # one fused softmax (no log-sum-exp kept: nothing merges these): ~2.3x faster than exp(s - lse) on a CPU
    out = torch.einsum("nhqs,nshd->nqhd", torch.softmax(s, dim=-1), v.to(dt))
    return out.to(q.dtype)


def mla_absorbed_attention(q_lat, q_rope, latents, kv_lora_rank: int, scale: float, q_offset: int, causal=True):
    """Absorbed-form attention of one sequence.

    q_lat [Tq, H, R], q_rope [Tq, H, Dr], latents [S, R + Dr]. Returns out_lat [Tq, H, R] and lse [Tq, H].
    """
    c_kv, k_r = latents[:, :kv_lora_rank], latents[:, kv_lora_rank:]
    q = torch.cat([q_lat, q_rope], dim=-1)
    k = torch.cat([c_kv, k_r], dim=-1).unsqueeze(1).expand(-1, q.shape[1], -1)
    v = c_kv.unsqueeze(1).expand(-1, q.shape[1], -1)
    return attention_with_lse(q, k, v, scale, q_offset, causal)


def merge_attention_states(outs: list[torch.Tensor], lses: list[torch.Tensor]):
    """Exact merge of partial attention results over disjoint key sets: out [T, H, D], lse [T, H] each."""
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    out = sum(o.to(lse.dtype) * torch.exp(l - lse).unsqueeze(-1) for o, l in zip(outs, lses))
    return out.to(outs[0].dtype), lse


def mla_decode_paged(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float):
    """Reference of the batched paged decode (see kestrel.ops.mla.decode_paged): all sequences at once, keys
    gathered through the page table into a padded [B, S_max] block and masked past each sequence's length."""
    page_size = kv_buffer.shape[1]
    B, H, R = q_lat.shape
    dt = torch.float64 if q_lat.dtype == torch.float64 else torch.float32
    s_max = int(page_table.shape[1]) * page_size
    pos = torch.arange(s_max, device=q_lat.device)
    beyond = pos[None, :] >= seq_lens.view(B, 1)
    # NOTE: rows past a sequence's end are whatever the page held (NaN in tests), and a masked score's zero weight
    # times NaN is still NaN: those positions read the sequence's first row instead (finite, weight exactly 0)
    p = torch.where(beyond, 0, pos[None, :])  # [B, S]
    pages = page_table.long().gather(1, p // page_size)
    if kv_buffer.is_contiguous():  # one row copy per key (3x faster than 2-D advanced indexing on a CPU)
        rows = (pages * page_size + p % page_size).view(-1)
        lat = kv_buffer.view(-1, kv_buffer.shape[-1]).index_select(0, rows).view(B, s_max, -1)
    else:  # a strided view (the unified pool)
        lat = kv_buffer[pages, p % page_size]
    lat = lat.to(dt)  # [B, S, R + Dr]
    q = torch.cat([q_lat, q_rope], dim=-1).to(dt)  # [B, H, R + Dr]
    s = torch.einsum("bhd,bsd->bhs", q, lat) * scale
    s = s.masked_fill(beyond.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhs,bsr->bhr", torch.exp(s - lse.unsqueeze(-1)), lat[..., :kv_lora_rank])
    return out.to(q_lat.dtype), lse


def mla_verify_paged(q_lat, q_rope, kv_buffer, page_table, key_lens, kv_lora_rank: int, scale: float):
    """Absorbed-form attention of B speculative blocks of L query tokens each (the CPU's verify path): each
    block's keys are gathered once through its page-table row and every token masked to its own key count, where
    `mla_decode_paged` over the table expanded per token would gather them L times.

    q_lat [B * L, H, R], q_rope [B * L, H, Dr], kv_buffer [P, page_size, R + Dr], page_table [B, max_pages],
    key_lens [B * L] (keys each token sees, its own included; >= 1). Returns out_lat [B * L, H, R] (the per-token
    decode's values up to rounding)."""
    page_size = kv_buffer.shape[1]
    B = page_table.shape[0]
    T, H, R = q_lat.shape
    L = T // B
    dt = torch.float64 if q_lat.dtype == torch.float64 else torch.float32
    s_max = int(page_table.shape[1]) * page_size
    keys = key_lens.view(B, L)
    pos = torch.arange(s_max, device=q_lat.device)
    # as in mla_decode_paged: positions no token of the block reads take the block's first row (finite)
    p = torch.where(pos[None, :] >= keys.amax(1, keepdim=True), 0, pos[None, :])  # [B, S]
    pages = page_table.long().gather(1, p // page_size)
    if kv_buffer.is_contiguous():
        rows = (pages * page_size + p % page_size).view(-1)
        lat = kv_buffer.view(-1, kv_buffer.shape[-1]).index_select(0, rows).view(B, s_max, -1)
    else:
        lat = kv_buffer[pages, p % page_size]
    lat = lat.to(dt)  # [B, S, R + Dr]
    q = torch.cat([q_lat, q_rope], dim=-1).to(dt).view(B, L * H, -1)
    s = (q @ lat.transpose(1, 2)).view(B, L, H, s_max) * scale
    s = s.masked_fill((pos.view(1, 1, 1, -1) >= keys.view(B, L, 1, 1)), float("-inf"))
    out = torch.softmax(s, dim=-1).view(B, L * H, s_max) @ lat[..., :kv_lora_rank]
    return out.view(T, H, R).to(q_lat.dtype)
