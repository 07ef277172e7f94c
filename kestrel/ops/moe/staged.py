"""The expert GEMVs (gate/up, down) with their weight tiles staged in shared memory before the PDL wait (Gluon).

At batch 1 the decode chain's MoE kernels (expert up, expert down, the paired tail) all load their weight tiles
before their waits, into registers, and together they ask for more registers than the SMs have (k3-mini on an H200:
~47 MB against 33.8; docs/kernels.md, 2026-12-07 16:37, next step 7). The programs that find no registers start
late and stream their weights after the kernel before them has finished. Here the tiles go through `cp.async` into
shared memory (a separate 228 KB an SM) instead: a program issues its copies, waits for the kernel before it, loads
its input, then reads the tiles back in the layout the Triton kernel (`triton._gemv_up_kernel`, `_down_early`)
computes in, so the reductions run in the same order and, at k3-mini's shapes, the output is bit-equal to it.

Plain Triton cannot do this: its loads go to registers, and its own shared-memory pipelining is a loop's, placed
after whatever precedes the loop (the wait). Gluon (Triton's lower-level dialect) states the copies, the layouts and
the wait explicitly. CUDA only (the copies are sm_80+); the Triton kernel serves everything else.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from kestrel.ops.gluon_utils import act as _act, gdc_launch_dependents as _gdc_launch_dependents, gdc_wait as _gdc_wait
from kestrel.ops.gluon_utils import row_layout


@gluon.jit
def _gemv_up_staged_kernel(x_ptr, ids_ptr, w1_ptr, w3_ptr, h_ptr, beta, linear_beta, D: gl.constexpr,
                           I: gl.constexpr, TOPK: gl.constexpr, BI: gl.constexpr, SITU: gl.constexpr,
                           TR: gl.constexpr, TC: gl.constexpr, WR: gl.constexpr, WC: gl.constexpr, PDL: gl.constexpr):
    """One (token, slot) pair's BI rows of the gate and up projections (the expert ids are final before this kernel
    starts: the front GEMV before it triggers late), then the activation. Grid (pairs, I / BI)."""
    if PDL:
        _gdc_launch_dependents()
    # 8 contiguous elements a thread (one 16-byte copy) and the threads along the row first (see row_layout)
    tile: gl.constexpr = gl.BlockedLayout([1, 8], [TR, TC], [WR, WC], [1, 0])
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    p = gl.program_id(0).to(gl.int64)
    t = p // TOPK
    e = gl.load(ids_ptr + p).to(gl.int64)
    rows = gl.program_id(1) * BI + gl.arange(0, BI, layout=gl.SliceLayout(1, tile))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, tile))
    offs = (e * I + rows[:, None]) * D + cols[None, :]
    w1s = gl.allocate_shared_memory(w1_ptr.dtype.element_ty, [BI, D], flat)
    w3s = gl.allocate_shared_memory(w3_ptr.dtype.element_ty, [BI, D], flat)
    async_copy.async_copy_global_to_shared(w1s, w1_ptr + offs)
    async_copy.async_copy_global_to_shared(w3s, w3_ptr + offs)
    async_copy.commit_group()
    if PDL:
        _gdc_wait()
    x = gl.load(x_ptr + t * D + cols).to(gl.float32)
    async_copy.wait_group(0)
    a = gl.sum(w1s.load(tile).to(gl.float32) * x[None, :], 1)
    b = gl.sum(w3s.load(tile).to(gl.float32) * x[None, :], 1)
    dt: gl.constexpr = h_ptr.dtype.element_ty
    # the reference rounds each projection and the activation to the activation dtype
    y = _act(a.to(dt).to(gl.float32), b.to(dt).to(gl.float32), beta, linear_beta, SITU)
    gl.store(h_ptr + p * I + rows, y.to(dt))


@gluon.jit
def _gemv_down_staged_kernel(h_ptr, ids_ptr, wts_ptr, w2_ptr, out_ptr, D: gl.constexpr, I: gl.constexpr,
                             IP: gl.constexpr, TOPK: gl.constexpr, BN: gl.constexpr, TE: gl.constexpr,
                             TR: gl.constexpr, TC: gl.constexpr, WE: gl.constexpr, WR: gl.constexpr,
                             WC: gl.constexpr, LATE_TRIGGER: gl.constexpr, PDL: gl.constexpr):
    """Token t's BN output rows of the down projection, its k experts weighted and summed: the k [BN, I] tiles
    copied into shared memory as one [k, BN, I] block before the wait, then the products and their sum as
    triton._down_early forms them (the same layout, so the same order). Grid (tokens, D / BN)."""
    if PDL:
        if not LATE_TRIGGER:
            _gdc_launch_dependents()
    blk: gl.constexpr = gl.BlockedLayout([1, 1, 8], [TE, TR, TC], [WE, WR, WC], [2, 0, 1])
    ek: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, blk))  # [k] along the block's first axis
    hk: gl.constexpr = gl.SliceLayout(1, blk)  # [k, I] rows of h
    t = gl.program_id(0).to(gl.int64)
    jj = gl.arange(0, TOPK, layout=ek)
    ev = gl.load(ids_ptr + t * TOPK + jj).to(gl.int64)
    dt: gl.constexpr = out_ptr.dtype.element_ty
    wv = gl.load(wts_ptr + t * TOPK + jj).to(dt).to(gl.float32)
    rows = gl.program_id(1) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(0, blk)))
    cols = gl.arange(0, IP, layout=gl.SliceLayout(0, gl.SliceLayout(0, blk)))
    e3 = gl.expand_dims(gl.expand_dims(ev, 1), 2)
    r3 = gl.expand_dims(gl.expand_dims(rows, 1), 0)
    c3 = gl.expand_dims(gl.expand_dims(cols, 0), 0)
    ws = gl.allocate_shared_memory(w2_ptr.dtype.element_ty, [TOPK, BN, IP], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    async_copy.async_copy_global_to_shared(ws, w2_ptr + (e3 * D + r3) * I + c3, mask=c3 < I)
    async_copy.commit_group()
    if PDL:
        _gdc_wait()
        if LATE_TRIGGER:
            _gdc_launch_dependents()
    jh = gl.arange(0, TOPK, layout=gl.SliceLayout(1, hk))
    ch = gl.arange(0, IP, layout=gl.SliceLayout(0, hk))
    hv = gl.load(h_ptr + gl.expand_dims(t * TOPK + jh, 1) * I + gl.expand_dims(ch, 0),
                 mask=gl.expand_dims(ch, 0) < I, other=0.0)
    async_copy.wait_group(0)
    y = gl.sum(ws.load(blk).to(gl.float32) * gl.expand_dims(hv.to(gl.float32), 1), 2)  # [k, BN]
    acc = gl.sum(y.to(dt).to(gl.float32) * gl.expand_dims(wv, 1), 0)
    out_rows = gl.program_id(1) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, blk)))
    gl.store(out_ptr + t * D + out_rows, acc.to(dt))


def _down_layout(TOPK: int, BN: int, IP: int, warps: int) -> tuple[int, ...] | None:
    """(threads along experts, rows, columns, warps along experts, rows, columns) of the [k, BN, IP] block, 8
    columns a thread: threads and warps along the columns while there are columns for them, then the threads along
    the rows and the warps along the experts. At k3-mini's shapes (k 8, BN 4, I 512, 4 warps) that is Triton's
    layout for triton._down_early's block (sm_90 TTGIR: threadsPerWarp [1, 1, 32], warpsPerCTA [2, 1, 2])."""
    tc = min(32, IP // 8)
    if tc < 1:
        return None
    tr = min(32 // tc, BN)
    te = 32 // tc // tr
    wc = min(warps, max(1, IP // (8 * tc)))
    we = min(warps // wc, max(1, TOPK // te))
    wr = warps // wc // we
    if IP % (8 * tc * wc) or BN % (tr * wr) or TOPK % (te * we):
        return None
    return te, tr, tc, we, wr, wc


def down_serves(D: int, I: int, TOPK: int, BN: int, warps: int, dtype, quantized: bool) -> bool:
    """Whether the staged down kernel takes this shape: dense 16-bit weights, whole row blocks."""
    IP = 1 << max(I - 1, 0).bit_length()
    return (not quantized and dtype.itemsize == 2 and I % 8 == 0 and D % BN == 0 and TOPK & (TOPK - 1) == 0
            and _down_layout(TOPK, BN, IP, warps) is not None)


def gemv_down(h, ids, wts, w2, out, BN: int, warps: int, late_trigger: bool, pdl: dict) -> None:
    """out[t] = sum_j round(wts[t, j]) * round(w2[ids[t, j]] h[t k + j]) for every token t, in place."""
    T, k = ids.shape
    D, I = out.shape[-1], h.shape[-1]
    IP = 1 << max(I - 1, 0).bit_length()
    te, tr, tc, we, wr, wc = _down_layout(k, BN, IP, warps)
    _gemv_down_staged_kernel[(T, D // BN)](h, ids, wts, w2, out, D, I, IP, k, BN, TE=te, TR=tr, TC=tc, WE=we,
                                           WR=wr, WC=wc, LATE_TRIGGER=late_trigger, num_warps=warps, **pdl)


def serves(D: int, I: int, BI: int, warps: int, dtype, quantized: bool) -> bool:
    """Whether the staged kernel takes this shape: dense 16-bit weights, D a power of two, whole row blocks."""
    return (not quantized and dtype.itemsize == 2 and D >= 8 and D & (D - 1) == 0 and I % BI == 0
            and row_layout(D, BI, warps) is not None)


def gemv_up(x, ids, w1, w3, h, act, BI: int, warps: int, pdl: dict) -> None:
    """h[p] = act(w1[ids[p]] x[p // k], w3[ids[p]] x[p // k]) for every (token, slot) pair p, in place."""
    NP, k = ids.numel(), ids.shape[-1]
    D, I = x.shape[-1], h.shape[-1]
    tr, tc, wr, wc = row_layout(D, BI, warps)
    _gemv_up_staged_kernel[(NP, I // BI)](x, ids, w1, w3, h, act.beta, act.linear_beta, D, I, k, BI,
                                          SITU=act.kind == "situ", TR=tr, TC=tc, WR=wr, WC=wc, num_warps=warps,
                                          **pdl)
