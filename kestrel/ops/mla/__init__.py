"""MLA attention ops, dispatched by device."""

from kestrel.ops import kernel
from kestrel.ops.mla import reference
from kestrel.ops.mla.reference import (  # noqa: F401
    attention_padded, gather_latents, gather_packed_latents, latent_entries, merge_attention_states)


def attention(q, k, v, scale: float, q_offset: int):
    """Causal attention of one sequence's new tokens over its keys: see reference.attention_with_lse."""
    fn = kernel(__name__ + ".triton", "attention_with_lse", q) or reference.attention_with_lse
    return fn(q, k, v, scale, q_offset)


def attention_varlen(q, k, v, scale: float, cu_q: list[int], cu_k: list[int], q_offsets: list[int]):
    """Causal attention of packed sequences' new tokens over their keys, one launch on a GPU: see
    reference.attention_varlen_with_lse."""
    fn = kernel(__name__ + ".triton", "attention_varlen_with_lse", q) or reference.attention_varlen_with_lse
    return fn(q, k, v, scale, cu_q, cu_k, q_offsets)


def decode_paged(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float):
    """Absorbed-form decode over the paged latent cache, one query token per sequence.

    q_lat [B, H, R], q_rope [B, H, Dr], kv_buffer [P, page_size, R + Dr], page_table [B, max_pages],
    seq_lens [B] (keys per sequence, the new token's included). Returns out_lat [B, H, R] and lse [B, H].
    """
    fn = kernel(__name__ + ".triton", "mla_decode_paged", q_lat) or reference.mla_decode_paged
    return fn(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale)


def decode_project(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank: int, scale: float, w):
    """head_gemv(decode_paged(...)[0], w): the decode's attention output through W_uv (w [H, N, R]), [B, H, N].
    On a GPU, up to COMBINE_IN_HEAD_GEMV_MAX_ROWS rows merge the split results inside the head GEMV (one launch
    fewer)."""
    fn = kernel(__name__ + ".triton", "mla_decode_project", q_lat) \
        if FUSED_ABSORB and q_lat.shape[0] <= COMBINE_IN_HEAD_GEMV_MAX_ROWS else None
    if fn is not None:
        return fn(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale, w)
    out_lat = decode_paged(q_lat, q_rope, kv_buffer, page_table, seq_lens, kv_lora_rank, scale)[0]
    return head_gemv(out_lat.to(q_lat.dtype), w)


def verify_paged(q_lat, q_rope, kv_buffer, page_table, key_lens, kv_lora_rank: int, scale: float):
    """Absorbed-form attention of B speculative blocks of L tokens (q_lat [B * L, H, R]) over the paged cache,
    block b's tokens through page_table row b, token t over its first key_lens[t] keys: out_lat [B * L, H, R].
    On CUDA the decode kernel per token (each reading its block's table row in place); elsewhere the block form,
    which gathers each block's keys once."""
    fn = kernel(__name__ + ".triton", "mla_decode_paged", q_lat)
    if fn is None:
        return reference.mla_verify_paged(q_lat, q_rope, kv_buffer, page_table, key_lens, kv_lora_rank, scale)
    B, T = page_table.shape[0], q_lat.shape[0]
    return fn(q_lat, q_rope, kv_buffer, page_table, key_lens, kv_lora_rank, scale, rows_per_table=T // B)[0]


def store_latent(kv_a, weight, eps: float, rank: int, kv_buffer, loc):
    """The latent RMSNorm, [c_kv | k_r] and the paged cache write in one op: see reference.store_latent."""
    fn = (kernel(__name__ + ".triton", "store_latent", kv_a) if FUSED_STORE else None) or reference.store_latent
    fn(kv_a, weight, eps, rank, kv_buffer, loc)


# off: the latent store runs as torch ops around the norm kernel (the decode ladder's "before" stage)
FUSED_STORE = True


def head_gemv(x, w):
    """y[t, h] = w[h] @ x[t, h] for x [T, H, K], w [H, N, K]: see reference.head_gemv (a kernel for decode rows)."""
    fn = (kernel(__name__ + ".triton", "head_gemv", x) if FUSED_ABSORB else None) or reference.head_gemv
    return fn(x, w)


# off: the absorbed projections run as batched matmuls (the decode ladder's "before" stage)
FUSED_ABSORB = True

# decode steps of at most this many rows merge their split attention results inside the W_uv head GEMV after them,
# not by their own combine launch (one launch fewer on the chain per MLA layer; 0: never). k3-mini's decode graph
# on an H100 (2026-12-07, docs/kernels.md): 1.006x at batch 1, 0.987x at batch 8 (call 183); 1.003x at batch 1
# (call 185)
COMBINE_IN_HEAD_GEMV_MAX_ROWS = 1
