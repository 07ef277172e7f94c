"""The DSpark drafter's sequential correction as ops (see kestrel.spec.drafter): the correction MLP's input and up
projection, and the vocabulary projection's argmax as packed keys. Plain torch, bit-equal to the drafter's own
formulas; kestrel.ops.dspark.triton and step_triton fuse each into one kernel."""

import torch
import torch.nn.functional as F

import kestrel.ops as ops
from kestrel.ops import norm as norm_ops
from kestrel.ops.norm import reference as norm_ref

LOW = 0xFFFFFFFF


def rms(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The drafter's RMSNorm: in fp32, cast back to x's dtype."""
    if x.is_cuda and not torch.is_grad_enabled():
        # drafting on a GPU: one kernel, not the formula's eight launches (about 30 norms a draft; the same
        # roundings, its sum ordered otherwise); training keeps the differentiable formula
        return norm_ops.rms_norm(x, weight, eps)
    if x.dtype == torch.float32 and norm_ref.fused_ok(x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else y * weight


def rms_rows(parts: list[torch.Tensor], eps: float) -> torch.Tensor:
    """[rms(p) for p in parts] side by side ([N, D_i] each -> [N, sum D_i]), parts of equal width normalised as one
    stack: each row is normalised alone, so the values are a norm per part's (one or two calls instead of three a
    drafted position on the CPU)."""
    out, i = [], 0
    while i < len(parts):
        j = i + 1
        while j < len(parts) and parts[j].shape == parts[i].shape:
            j += 1
        N, D = parts[i].shape
        x = parts[i] if j == i + 1 else torch.cat(parts[i:j], -1).view(N, j - i, D)
        out.append(rms(x, eps).view(N, (j - i) * D))
        i = j
    return out[0] if len(out) == 1 else torch.cat(out, -1)


def pack(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Argmax keys: int64 whose signed order is (value's float order, then the lower id first), so the max key
    over a row holds the row's argmax as torch.argmax picks it (the first of equal values). values fp32-castable,
    ids int64 in [0, 2^32)."""
    bits = (values.float() + 0.0).view(torch.int32)  # (+ 0.0: -0.0 ranks with +0.0)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-integer order = float order
    return (ordered.long() << 32) | (LOW - ids)


def decode(keys: torch.Tensor) -> torch.Tensor:
    """[..., P] partial keys (any P >= 1) -> [...] int64 ids of the best."""
    return LOW - (keys.amax(-1) & LOW)


def decode_keys(keys: list[torch.Tensor], confidence=None):
    """Each drafted position's partial keys ([B, P] each, one tensor a position) -> tokens [B, positions] int64;
    given the first position's confidence inputs (stats, state, up, down, eps), (tokens, first_confidence(...))."""
    tokens = decode(torch.stack(keys, 1))
    return tokens if confidence is None else (tokens, first_confidence(*confidence))


def block_front(features: torch.Tensor, last_token: torch.Tensor, emb: torch.Tensor, feature_norm: torch.Tensor,
                token_norm: torch.Tensor, fc: torch.Tensor, slots: torch.Tensor, eps: float) -> torch.Tensor:
    """The drafter block's input [N, 1 + gamma, D]: the context ctx = fc @ [rms(f_l) * feature_norm_l for each
    feature layer l, rms(emb[last_token]) * token_norm], then ctx + slots[i] for each of the gamma slots [gamma, D]
    (features [N, L * T], fc [D, (L + 1) * T]); as DSparkDrafter.block's module formulas compute it."""
    N = features.shape[0]
    L, T = feature_norm.shape
    f = rms(features.to(fc.dtype).view(N, L, T), eps, feature_norm)  # layers differ in scale: normalise each
    e = rms(emb[last_token], eps, token_norm)
    ctx = F.linear(torch.cat([f.flatten(1), e], -1), fc)  # [N, D]
    return torch.cat([ctx[:, None], ctx[:, None] + slots], 1)


def block_attention(qkv: torch.Tensor, heads: int, S: int) -> torch.Tensor:
    """The drafter block's causal self-attention over each request's S positions: qkv [N * S, 3 * D] (the fused
    projection's output, q | k | v, heads side by side in each) -> [N * S, D], scale 1 / sqrt(head dim)."""
    T, D = qkv.shape[0], qkv.shape[1] // 3
    q, k, v = qkv.view(T // S, S, 3, heads, -1).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [N, H, S, hd]
    return o.transpose(1, 2).reshape(T, D)


def prev_tokens(prev: torch.Tensor) -> torch.Tensor:
    """The previous tokens from ids [B] or from partial argmax keys [B, P]."""
    return decode(prev) if prev.dim() == 2 else prev


def correct_up(slot: torch.Tensor, state: torch.Tensor, prev: torch.Tensor, emb: torch.Tensor,
               w_up: torch.Tensor, eps: float) -> torch.Tensor:
    """silu(w_up @ [rms(slot), rms(state), rms(emb[prev])]) -> [B, C] (RMSNorms without weights): the correction
    MLP's hidden layer for slot outputs and previous corrected states [B, D] and previous tokens (ids [B], or the
    previous position's partial argmax keys [B, P])."""
    return F.silu(F.linear(rms_rows([slot, state, emb[prev_tokens(prev)]], eps), w_up))


def head_keys(h: torch.Tensor, w: torch.Tensor, stats: bool = False, eps: float | None = None):
    """The argmax of the logits h @ w^T (rounded to h's dtype, as the lm_head's output is) as partial keys [B, 1];
    with stats, also the logits' summary [B, 1, 3] (`head_stats`): (keys, stats). With eps, h is RMS-normalised
    first (no weight: a head with the norm's weight folded in)."""
    logits = F.linear(h if eps is None else rms(h, eps), w)
    ids = logits.argmax(-1, keepdim=True)
    keys = pack(logits.gather(-1, ids), ids)
    return (keys, head_stats(logits).unsqueeze(1)) if stats else keys


def head_stats(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [..., 3] fp32: the largest logit, the second largest (equal to the largest on a tie) and the sum
    of exp(logit - largest): what `peak` needs, kept per tile of the vocabulary by the head's kernel."""
    x = logits.float()
    top = x.topk(2, -1).values
    return torch.cat([top, torch.exp(x - top[..., :1]).sum(-1, keepdim=True)], -1)


def peak(stats: torch.Tensor) -> torch.Tensor:
    """Partial stats [B, P, 3] (one per tile of the vocabulary) -> [B, 2]: the two largest log-probabilities (the
    drafter's `peak`). The largest two of the tiles' largest two, and logsumexp = m + log sum_p s_p exp(m_p - m)."""
    m1, m2, s = stats.unbind(-1)
    top = torch.cat([m1, m2], -1).topk(2, -1).values  # [B, 2]
    lse = top[:, :1] + torch.log((s * torch.exp(m1 - top[:, :1])).sum(-1, keepdim=True))
    return top - lse


def confidence_logits(state: torch.Tensor, top2: torch.Tensor, up: torch.nn.Linear, down: torch.nn.Linear,
                      eps: float) -> torch.Tensor:
    """The confidence head on drafter states [..., D] and their peaks [..., 2] -> logits [...] fp32: a two-layer
    MLP (SiLU) on the state's RMSNorm beside the peak."""
    x = torch.cat([rms(state, eps), top2.to(state.dtype)], -1)
    return down(F.silu(up(x)))[..., 0].float()


def first_confidence(stats: torch.Tensor, state: torch.Tensor, up: torch.nn.Linear, down: torch.nn.Linear,
                     eps: float) -> torch.Tensor:
    """The probability [B, 1] fp32 that the target accepts a position's draft, from the head's partial stats
    [B, P, 3] and the position's corrected state [B, D] (the context lookup's gate on the first position)."""
    return torch.sigmoid(confidence_logits(state, peak(stats), up, down, eps)).unsqueeze(1)


def resolve(x0: torch.Tensor, prefix: torch.Tensor, ref: torch.Tensor, future: torch.Tensor,
            future_prefix: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each request's last committed token and prefix length on the device (the speculative step's first op):
    x0 < 0 is a future reference (-x0 - 1 indexes `future`, the token a step not yet seen by the host produces),
    and a row with ref >= 0 takes its prefix length from that step (future_prefix[ref], the length after its
    commit) instead of `prefix`. With the drafts each block may keep (-1: a padding row), also its token count
    keep + 1 and whether it is real (keep >= 0). All [B] int64 (real: bool)."""
    x0 = torch.where(x0 < 0, future[(-x0 - 1).clamp_min(0)], x0)
    return x0, torch.where(ref >= 0, future_prefix[ref.clamp_min(0)], prefix), keep + 1, keep >= 0


def block_positions(prefix: torch.Tensor, n: torch.Tensor, table: torch.Tensor, page_size: int, scratch_page: int,
                    L: int, x0: torch.Tensor | None = None, drafts: torch.Tensor | None = None):
    """Where a VERIFY batch of B blocks padded to L tokens reads and writes: block i feeds n[i] real tokens from
    position prefix[i]; past them (and in blocks with n = 0) tokens write their latents to the scratch page and
    attend to their block's real keys only (at least one key). Returns (positions [B * L] int64, cache locations
    [B * L] int64, keys per token [B * L] int32, n [B] int32, token ids [B * L] or None); table [B, width] the page
    table. Given each block's last committed token x0 [B] and drafts [B, >= L - 1], the ids are the blocks
    [x0, drafts[:, :L - 1]]."""
    B, width = n.shape[0], table.shape[1]
    step = torch.arange(L, device=n.device).view(1, L)
    pos = prefix.view(B, 1) + step
    real = step < n.view(B, 1)
    page = table.gather(1, torch.where(real, pos // page_size, 0).clamp_max(width - 1)).long()
    locs = torch.where(real, page * page_size + pos % page_size, scratch_page * page_size)
    keys = (torch.minimum(pos, (prefix + n - 1).view(B, 1)) + 1).clamp_min(1)
    ids = None if x0 is None else torch.cat([x0.view(B, 1), drafts[:, : L - 1]], 1).view(-1)
    return pos.view(-1), locs.view(-1), keys.view(-1).to(torch.int32), n.to(torch.int32), ids


def gather_rows(parts: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """[p[rows] for p in parts] side by side: parts [T, D_i] -> [len(rows), sum D_i] (the drafter's next features
    from the verify pass's captured layers, at each block's last committed position)."""
    return torch.cat([p[rows] for p in parts], -1)


def accept_greedy(logits: torch.Tensor, drafts: torch.Tensor, keep: torch.Tensor, n: torch.Tensor,
                  snap_n: torch.Tensor, publish=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance of B verified blocks of L tokens on the device: logits [B * L, V] of the blocks
    [last token, drafts[:, :L-1]], drafts [B, G] (G >= L - 1), keep [B] drafts each block may accept, n [B] real
    tokens (0: a padding row, which commits nothing), snap_n [B] the committed count at which a prefix-cache snapshot
    is due (0: none). Accepted = the longest prefix of drafts equal to the target's argmax, capped by keep.

    Returns (packed [B, G + 2] int64: the drafts, the target's token after the accepted ones, the number accepted;
    commit [B] int32 steps to fold (accepted + 1, 0 for padding); snapshots [B] int32 (snap_n where the commit
    reaches it, else 0); rows [B] int64, the logits row of each block's last committed position). publish: None, or
    (future, future_prefix, at, prefix) to also write each block's next token to future[at[b]] and its prefix length
    after the commit (prefix [B] + commit, int64) to future_prefix[at[b]], where a step chained onto this one reads
    them."""
    B, G = drafts.shape
    L = logits.shape[0] // B
    top = ops.argmax(logits).view(B, L)
    steps = torch.arange(L - 1, device=keep.device).view(1, L - 1)
    match = (drafts[:, : L - 1] == top[:, : L - 1]) & (steps < keep.view(B, 1))
    acc = match.long().cumprod(1).sum(1)
    commit = torch.where(n > 0, acc + 1, 0).to(torch.int32)
    taken = (snap_n > 0) & (snap_n <= commit)
    snaps = torch.where(taken, snap_n, 0).to(torch.int32)
    rows = torch.arange(B, device=keep.device) * L + (commit.long() - 1).clamp_min(0)
    packed = torch.cat([drafts, top.gather(1, acc.view(B, 1)), acc.view(B, 1)], 1)
    if publish is not None:
        future, future_prefix, at, prefix = publish
        future[at] = packed[:, G]
        future_prefix[at] = prefix + commit.long()
    return packed, commit, snaps, rows


def accept_lazy(hidden: torch.Tensor, head, drafts: torch.Tensor, keep: torch.Tensor, n: torch.Tensor,
                snap_n: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """accept_greedy with the vocabulary projection `head` (rows [R, D] -> logits [R, V]) applied only to the rows
    acceptance reads: position j of the blocks whose drafts all matched before j, so each block's rows up to its
    first mismatch (or its last allowed draft). hidden [B * L, D]: the final normed states of the B blocks of L
    tokens. A host loop over positions (the CPU's greedy step): at ~3 tokens a step, ~3 of a block's 8 rows of
    the LM head, each a one-row product. Returns accept_greedy's four tensors; a padding block's (n = 0) packed
    row holds zeros for the target's token and the count (accept_greedy's holds its argmax): nothing reads it."""
    B, G = drafts.shape
    keep_l, n_l, snap_l, d = keep.tolist(), n.tolist(), snap_n.tolist(), drafts.tolist()
    acc, bonus = [0] * B, [0] * B
    live = [i for i in range(B) if n_l[i] > 0]
    for j in range(L):
        if not live:
            break
        if len(live) == 1:  # a view of the one row
            rows = hidden[live[0] * L + j : live[0] * L + j + 1]
        else:
            rows = hidden[torch.tensor([i * L + j for i in live], device=hidden.device)]
        nxt = []
        for i, tok in zip(live, ops.argmax(head(rows)).tolist()):
            if j < keep_l[i] and j + 1 < min(L, n_l[i]) and tok == d[i][j]:
                nxt.append(i)  # draft j accepted: row j + 1 is read too
            else:
                acc[i], bonus[i] = j, tok
        live = nxt
    commit = [a + 1 if m > 0 else 0 for a, m in zip(acc, n_l)]
    snaps = [s if 0 < s <= c else 0 for s, c in zip(snap_l, commit)]
    dev = drafts.device
    tail = torch.tensor([bonus, acc], dtype=drafts.dtype, device=dev).t()
    return (torch.cat([drafts, tail], 1), torch.tensor(commit, dtype=torch.int32, device=dev),
            torch.tensor(snaps, dtype=torch.int32, device=dev),
            torch.tensor([i * L + max(c - 1, 0) for i, c in enumerate(commit)], device=dev))
