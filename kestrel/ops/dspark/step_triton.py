"""Triton kernels of the greedy speculative step around the drafter (see reference.py): each request's last token
and prefix from the futures (`resolve`), the VERIFY batch's positions and cache locations (`block_positions`), the
next features' rows (`gather_rows`) and the acceptance (`accept_greedy`), so a whole step runs on the device with
no host synchronisation."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops import pdl, pdl_args
from kestrel.ops.triton_utils import launch, pdl_prologue


@triton.jit
def _resolve_kernel(x0_ptr, prefix_ptr, ref_ptr, future_ptr, after_ptr, keep_ptr, x0_out, prefix_out, n_out, real_out,
                    B, BP: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    i = tl.arange(0, BP)
    on = i < B
    keep = tl.load(keep_ptr + i, mask=on, other=-1)
    tl.store(n_out + i, keep + 1, mask=on)
    tl.store(real_out + i, (keep >= 0).to(tl.int8), mask=on)
    x0 = tl.load(x0_ptr + i, mask=on, other=0)
    ref = tl.load(ref_ptr + i, mask=on, other=-1)
    fut = tl.load(future_ptr + tl.maximum(-x0 - 1, 0), mask=on & (x0 < 0), other=0)
    chained = tl.load(after_ptr + tl.maximum(ref, 0), mask=on & (ref >= 0), other=0)
    tl.store(x0_out + i, tl.where(x0 < 0, fut, x0), mask=on)
    tl.store(prefix_out + i, tl.where(ref >= 0, chained, tl.load(prefix_ptr + i, mask=on, other=0)), mask=on)


def resolve(x0: torch.Tensor, prefix: torch.Tensor, ref: torch.Tensor, future: torch.Tensor,
            future_prefix: torch.Tensor, keep: torch.Tensor):
    """See reference.resolve: one program (int64 rows of any B)."""
    if any(t.dtype != torch.int64 for t in (x0, prefix, ref, future, future_prefix, keep)):
        from kestrel.ops.dspark.reference import resolve as ref_resolve
        return ref_resolve(x0, prefix, ref, future, future_prefix, keep)
    B = x0.shape[0]
    x0_out, prefix_out, n = torch.empty_like(x0), torch.empty_like(prefix), torch.empty_like(keep)
    real = torch.empty(B, dtype=torch.bool, device=x0.device)
    if B:
        _resolve_kernel[(1,)](x0.contiguous(), prefix.contiguous(), ref.contiguous(), future, future_prefix,
                              keep.contiguous(), x0_out, prefix_out, n, real.view(torch.int8), B,
                              BP=triton.next_power_of_2(B), num_warps=4, **pdl_args(x0))
    return x0_out, prefix_out, n, real


@triton.jit
def _block_positions_kernel(prefix_ptr, n_ptr, table_ptr, pos_ptr, locs_ptr, keys_ptr, n32_ptr, x0_ptr, drafts_ptr,
                            ids_ptr, stride_t, stride_d, width, ps, scratch, L: tl.constexpr, LP: tl.constexpr,
                            IDS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    b = tl.program_id(0).to(tl.int64)
    step = tl.arange(0, LP)
    on = step < L
    pre = tl.load(prefix_ptr + b)
    n = tl.load(n_ptr + b)
    pos = pre + step
    real = step < n
    idx = tl.minimum(tl.where(real, pos // ps, 0), width - 1)
    page = tl.load(table_ptr + b * stride_t + idx, mask=on, other=0).to(tl.int64)
    locs = tl.where(real, page * ps + pos % ps, scratch * ps)
    keys = tl.maximum(tl.minimum(pos, pre + n - 1) + 1, 1)
    tl.store(pos_ptr + b * L + step, pos, mask=on)
    tl.store(locs_ptr + b * L + step, locs, mask=on)
    tl.store(keys_ptr + b * L + step, keys.to(tl.int32), mask=on)
    tl.store(n32_ptr + b, n.to(tl.int32))
    if IDS:  # the block's tokens: its last committed token, then its drafts
        d = tl.load(drafts_ptr + b * stride_d + step - 1, mask=on & (step > 0), other=0)
        tl.store(ids_ptr + b * L + step, tl.where(step == 0, tl.load(x0_ptr + b), d), mask=on)


def block_positions(prefix: torch.Tensor, n: torch.Tensor, table: torch.Tensor, page_size: int, scratch_page: int,
                    L: int, x0: torch.Tensor | None = None, drafts: torch.Tensor | None = None):
    """See reference.block_positions: one program per block (int64 prefix and n; a page table of unit column
    stride)."""
    ids = x0 is not None
    if (prefix.dtype != torch.int64 or n.dtype != torch.int64 or table.stride(-1) != 1
            or (ids and (x0.dtype != torch.int64 or drafts.dtype != torch.int64 or drafts.stride(-1) != 1))):
        from kestrel.ops.dspark.reference import block_positions as ref
        return ref(prefix, n, table, page_size, scratch_page, L, x0, drafts)
    B = n.shape[0]
    dev = n.device
    pos = torch.empty(B * L, dtype=torch.int64, device=dev)
    locs = torch.empty(B * L, dtype=torch.int64, device=dev)
    keys = torch.empty(B * L, dtype=torch.int32, device=dev)
    n32 = torch.empty(B, dtype=torch.int32, device=dev)
    out_ids = torch.empty(B * L, dtype=torch.int64, device=dev) if ids else None
    if B:
        _block_positions_kernel[(B,)](prefix.contiguous(), n.contiguous(), table, pos, locs, keys, n32,
                                      x0.contiguous() if ids else n, drafts if ids else n, out_ids if ids else n,
                                      table.stride(0), drafts.stride(0) if ids else 0, table.shape[1], page_size,
                                      scratch_page, L=L, LP=triton.next_power_of_2(L), IDS=ids, num_warps=1,
                                      **pdl_args(n))
    return pos, locs, keys, n32, out_ids


@triton.jit
def _gather_rows_kernel(p0, p1, p2, p3, s0, s1, s2, s3, rows_ptr, out_ptr, D: tl.constexpr, DP: tl.constexpr,
                        NP: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    r = tl.load(rows_ptr + b).to(tl.int64)
    c = tl.arange(0, DP)
    on = c < D
    if j == 0:
        x = tl.load(p0 + r * s0 + c, mask=on)
    elif j == 1:
        x = tl.load(p1 + r * s1 + c, mask=on)
    elif j == 2:
        x = tl.load(p2 + r * s2 + c, mask=on)
    else:
        x = tl.load(p3 + r * s3 + c, mask=on)
    tl.store(out_ptr + b * (NP * D) + j * D + c, x, mask=on)


def gather_rows(parts: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """See reference.gather_rows: one program per (row, part), for up to four parts of one width and dtype with
    unit column stride (else the reference)."""
    D = parts[0].shape[-1] if parts else 0
    if (not 0 < len(parts) <= 4 or any(p.dim() != 2 or p.shape[-1] != D or p.dtype != parts[0].dtype
                                       or p.stride(-1) != 1 for p in parts)):
        from kestrel.ops.dspark.reference import gather_rows as ref
        return ref(parts, rows)
    B, NP = rows.shape[0], len(parts)
    out = torch.empty(B, NP * D, dtype=parts[0].dtype, device=rows.device)
    ptrs = list(parts) + [parts[0]] * (4 - NP)
    if B:
        _gather_rows_kernel[(B, NP)](*ptrs, *(p.stride(0) for p in ptrs), rows.contiguous(), out, D=D,
                                     DP=triton.next_power_of_2(D), NP=NP, num_warps=1, **pdl_args(rows))
    return out


# logits an acceptance program compares at a time (a [positions, vocabulary piece] tile)
ACCEPT_TILE = 16384


@triton.jit
def _accept_kernel(logits_ptr, drafts_ptr, keep_ptr, n_ptr, snap_ptr, packed_ptr, commit_ptr, snaps_ptr, rows_ptr,
                   fut_ptr, fprefix_ptr, at_ptr, prefix_ptr, V, G, L: tl.constexpr, LP: tl.constexpr,
                   GP: tl.constexpr, BV: tl.constexpr, PUBLISH: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    rl = tl.arange(0, LP)
    rv = tl.arange(0, BV)
    rows = logits_ptr + (b * L + rl[:, None]).to(tl.int64) * V
    # every position's argmax at once, the first of equal values (as torch.argmax): [LP, BV] tiles of all L rows,
    # so the rows' loads are in flight together
    top = tl.zeros([LP], tl.int64)
    best = tl.full([LP], float("-inf"), tl.float32)
    v0 = 0
    while v0 < V:  # (a while loop: the interpreter cannot bound a range by an argument)
        cols = v0 + rv
        x = tl.load(rows + cols[None, :], mask=(rl[:, None] < L) & (cols[None, :] < V),
                    other=float("-inf")).to(tl.float32)
        m = tl.max(x, 1)
        i = tl.min(tl.where(x == m[:, None], cols[None, :], V), 1).to(tl.int64)
        take = m > best
        top = tl.where(take, i, top)
        best = tl.where(take, m, best)
        v0 += BV
    rg = tl.arange(0, GP)
    drafts = tl.load(drafts_ptr + b * G + rg, mask=rg < G, other=-1)
    keep = tl.load(keep_ptr + b)
    # match at position j < L - 1: draft j equals the target's token there and the block may accept it
    d = tl.sum(tl.where(rg[:, None] == rl[None, :], drafts[:, None], 0), 0)  # drafts on the positions' axis
    ok = (d == top) & (rl < L - 1) & (rl < keep)
    acc = tl.min(tl.where(ok, L - 1, rl), 0).to(tl.int64)  # the first position that fails (L - 1: none)
    n = tl.load(n_ptr + b)
    commit = tl.where(n > 0, acc + 1, 0)
    snap = tl.load(snap_ptr + b)
    snap = tl.where((snap > 0) & (snap <= commit), snap, 0)
    final = tl.sum(tl.where(rl == acc, top, 0), 0)
    tl.store(packed_ptr + b * (G + 2) + rg, drafts, mask=rg < G)
    tl.store(packed_ptr + b * (G + 2) + G, final)
    tl.store(packed_ptr + b * (G + 2) + G + 1, acc)
    tl.store(commit_ptr + b, commit.to(tl.int32))
    tl.store(snaps_ptr + b, snap.to(tl.int32))
    tl.store(rows_ptr + b, b * L + tl.maximum(commit - 1, 0))
    if PUBLISH:  # the next token and the prefix length after the commit, where a step chained onto this one reads them
        at = tl.load(at_ptr + b)
        tl.store(fut_ptr + at, final)
        tl.store(fprefix_ptr + at, tl.load(prefix_ptr + b) + commit.to(tl.int64))


def accept_greedy(logits: torch.Tensor, drafts: torch.Tensor, keep: torch.Tensor, n: torch.Tensor,
                  snap_n: torch.Tensor, publish=None):
    """See reference.accept_greedy: one program per block."""
    B, G = drafts.shape
    V = logits.shape[-1]
    L = logits.shape[0] // B
    dev = logits.device
    packed = torch.empty(B, G + 2, dtype=torch.int64, device=dev)
    commit = torch.empty(B, dtype=torch.int32, device=dev)
    snaps = torch.empty(B, dtype=torch.int32, device=dev)
    rows = torch.empty(B, dtype=torch.int64, device=dev)
    if publish is not None and any(t.dtype != torch.int64 for t in publish):
        from kestrel.ops.dspark.reference import accept_greedy as ref
        return ref(logits, drafts, keep, n, snap_n, publish)
    fut, fprefix, at, prefix = publish if publish is not None else (rows, rows, rows, rows)
    use_pdl = pdl(logits)
    if B:
        launch(_accept_kernel, (B,), logits.contiguous(), drafts.contiguous(), keep.contiguous(), n.contiguous(),
               snap_n.contiguous(), packed, commit, snaps, rows, fut, fprefix, at.contiguous(), prefix.contiguous(),
               V, G, L=L, LP=triton.next_power_of_2(L), GP=triton.next_power_of_2(G),
               BV=min(max(16, ACCEPT_TILE // triton.next_power_of_2(L)), triton.next_power_of_2(V)),
               PUBLISH=publish is not None, PDL=use_pdl, launch_pdl=use_pdl, num_warps=8, num_stages=1)
    return packed, commit, snaps, rows
