import torch

from kestrel.ops.mla import reference as ref
from tests.conftest import rel_err

D64 = torch.float64


def test_absorbed_equals_expanded():
    H, R, Dr, Dn, Dv, S, Tq = 3, 16, 4, 8, 8, 20, 5
    w_kv = torch.randn(H, Dn + Dv, R, dtype=D64)
    lat = torch.randn(S, R + Dr, dtype=D64)
    q = torch.randn(Tq, H, Dn + Dr, dtype=D64)
    # expanded: per-head keys and values
    k = torch.cat([torch.einsum("hdr,sr->shd", w_kv[:, :Dn], lat[:, :R]), lat[:, None, R:].expand(S, H, Dr)], -1)
    v = torch.einsum("hdr,sr->shd", w_kv[:, Dn:], lat[:, :R])
    o_exp, lse_exp = ref.attention_with_lse(q, k, v, 0.3, q_offset=S - Tq)
    q_lat = torch.einsum("thd,hdr->thr", q[..., :Dn], w_kv[:, :Dn])
    o_lat, lse_abs = ref.mla_absorbed_attention(q_lat, q[..., Dn:], lat, R, 0.3, q_offset=S - Tq)
    o_abs = torch.einsum("thr,hvr->thv", o_lat, w_kv[:, Dn:])
    assert rel_err(o_abs, o_exp) < 1e-13
    assert rel_err(lse_abs, lse_exp) < 1e-13


def test_lse_and_causal_mask():
    q, k, v = torch.randn(3, 2, 4, dtype=D64), torch.randn(6, 2, 4, dtype=D64), torch.randn(6, 2, 5, dtype=D64)
    out, lse = ref.attention_with_lse(q, k, v, 0.5, q_offset=3)
    for t in range(3):
        n = 3 + t + 1  # keys 0..q_offset+t
        s = torch.einsum("hd,shd->hs", q[t], k[:n]) * 0.5
        assert torch.allclose(lse[t], torch.logsumexp(s, -1))
        assert torch.allclose(out[t], torch.einsum("hs,shd->hd", torch.softmax(s, -1), v[:n]))


def test_merge_of_disjoint_key_sets_is_exact():
    q, k, v = torch.randn(4, 2, 8, dtype=D64), torch.randn(10, 2, 8, dtype=D64), torch.randn(10, 2, 8, dtype=D64)
    full, lse = ref.attention_with_lse(q, k, v, 0.4, 0, causal=False)
    # positions split by p mod 3, as decode context parallelism shards them
    parts = [ref.attention_with_lse(q, k[r::3], v[r::3], 0.4, 0, causal=False) for r in range(3)]
    merged, mlse = ref.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    assert rel_err(merged, full) < 1e-13 and rel_err(mlse, lse) < 1e-13


def test_paged_gather_and_decode():
    page_size, R, Dr, H = 4, 8, 2, 2
    buf = torch.randn(10, page_size, R + Dr, dtype=D64)
    table = torch.tensor([[7, 2, 5, 0], [3, 9, 0, 0]], dtype=torch.int32)
    lat = ref.gather_latents(buf, table[0], 10)
    assert torch.equal(lat[:4], buf[7]) and torch.equal(lat[4:8], buf[2]) and torch.equal(lat[8:], buf[5, :2])
    q_lat, q_rope = torch.randn(2, H, R, dtype=D64), torch.randn(2, H, Dr, dtype=D64)
    out, lse = ref.mla_decode_paged(q_lat, q_rope, buf, table, torch.tensor([10, 6]), R, 0.3)
    for i, n in enumerate([10, 6]):
        o_i, l_i = ref.mla_absorbed_attention(q_lat[i : i + 1], q_rope[i : i + 1], ref.gather_latents(buf, table[i], n), R, 0.3, n - 1)
        # the padded block sums over more (zero-weighted) keys than the sequence's own: the same value up to the
        # reduction's order, not bit for bit
        assert rel_err(out[i], o_i[0]) < 1e-13 and rel_err(lse[i], l_i[0]) < 1e-13


def test_verify_blocks_equal_per_token_decode():
    """The block form of the verify attention (keys gathered once per block) against the per-token paged decode
    over the table expanded to one row per token, on fresh random inputs with NaN in every unwritten row."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ())))
    page_size, R, Dr, H, B, L = 4, 8, 2, 3, 3, 5
    buf = torch.full((16, page_size, R + Dr), float("nan"), dtype=D64)
    table = torch.randperm(15, generator=gen)[: B * 4].view(B, 4).to(torch.int32) + 1
    prefix = torch.randint(1, 10, (B,), generator=gen)
    n = torch.randint(1, L + 1, (B,), generator=gen)  # real tokens per block; the rest are padding
    keys = torch.minimum(prefix.view(B, 1) + torch.arange(L), (prefix + n - 1).view(B, 1)) + 1  # [B, L]
    for b in range(B):  # write exactly the rows some token reads
        for pos in range(int(keys[b].max())):
            buf[table[b, pos // page_size], pos % page_size] = torch.randn(R + Dr, generator=gen, dtype=D64)
    q_lat, q_rope = torch.randn(B * L, H, R, generator=gen, dtype=D64), torch.randn(B * L, H, Dr, generator=gen, dtype=D64)
    key_lens = keys.view(-1).to(torch.int32)
    got = ref.mla_verify_paged(q_lat, q_rope, buf, table, key_lens, R, 0.3)
    want, _ = ref.mla_decode_paged(q_lat, q_rope, buf, table.repeat_interleave(L, 0), key_lens, R, 0.3)
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-13
    # a strided view of the buffer (the unified pool) takes the other gather
    wide = torch.cat([buf, torch.zeros(16, page_size, 3, dtype=D64)], -1)[..., : R + Dr]
    assert torch.equal(ref.mla_verify_paged(q_lat, q_rope, wide, table, key_lens, R, 0.3), got)


def test_paged_decode_ignores_garbage_past_the_end():
    buf = torch.randn(6, 4, 10, dtype=D64)
    buf[2, 3] = float("nan")  # unwritten rows of a partly filled page
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    out, lse = ref.mla_decode_paged(torch.randn(1, 2, 8, dtype=D64), torch.randn(1, 2, 2, dtype=D64), buf, table,
                                    torch.tensor([7]), 8, 0.3)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_gather_packed_latents_is_each_rows_gather_back_to_back():
    """The packed prefill's one-index gather (GPU MLA prefill) equals gather_latents of each page-table row in turn,
    across page boundaries and for a row that takes no keys."""
    buf = torch.randn(9, 4, 6, dtype=D64)
    table = torch.tensor([[3, 0, 5], [7, 1, 2], [8, 6, 4]], dtype=torch.int32)
    keys = [10, 0, 5]
    want = torch.cat([ref.gather_latents(buf, table[i], n) for i, n in enumerate(keys)])
    assert torch.equal(ref.gather_packed_latents(buf, table, keys), want)
