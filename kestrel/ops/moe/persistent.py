"""The latent MoE block of one decoding token as one persistent kernel (batch 1, CUDA).

At one token the MoE block is a chain of five launches: router logits, the front GEMV (latent down projection and
the shared experts' gate and up), the expert up GEMV (routing inside), the expert down GEMV, and the paired tail
(latent norm + up projection, plus the shared experts' activation + down projection). `_moe_block_kernel` runs the
same five stages in one launch whose programs are all resident at once, with grid-wide barriers (acquire/release
counters in global memory) in place of the kernel boundaries. Each program owns one tile of every stage and loads
the next stage's weight tile before it waits wherever that tile does not depend on the wait:
- the front tile before the router row, so the router's barrier overlaps it;
- the chosen experts' up tile (routing from the finished logits) before the front's barrier;
- the down tile (the same routing) before the up stage's barrier;
- the tail tile before the down stage's barrier.

Under the interpreter (a CPU) the stages run as five launches (STAGE = 0 .. 4): programs run one after another
there, so a barrier would wait forever. The arithmetic is the same code either way. Its roundings follow the
five kernels' (each product rounded where theirs is), but its tiles differ, so sums may differ in the last bit.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops.linear.triton import _input_row
from kestrel.ops.moe.triton import _route_row, route_row_serves
from kestrel.ops.triton_utils import act as _act, launch

# the counters of one launch: one per barrier (arrivals may run ahead of another barrier's waits), and the exit count
SYNC_WORDS = 5


@triton.jit
def _arrive(sync_ptr):
    """This program's stores are done: count it in (release: every thread's stores before the count)."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release")


@triton.jit
def _wait(sync_ptr, target):
    """Spin until the counter reaches target, all programs' arrivals (acquire: the stores they released before it
    are visible after it)."""
    c = tl.atomic_add(sync_ptr, 0, sem="acquire")
    while c < target:
        c = tl.atomic_add(sync_ptr, 0, sem="acquire")


@triton.jit
def _prefetch_l2(ptr, rows, n_rows, K: tl.constexpr, KP: tl.constexpr):
    """Ask L2 for the 128-byte lines of rows `rows` of a [n_rows, K] bf16 matrix (no registers held: the later load
    finds them in L2). Rows past n_rows ask for row 0 instead."""
    LINE: tl.constexpr = 64  # bf16 elements a line
    cols = tl.arange(0, KP // LINE) * LINE
    r = tl.where(rows < n_rows, rows, 0)
    ptrs = ptr + r[:, None].to(tl.int64) * K + tl.where(cols < K, cols, 0)[None, :]
    tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _moe_block_kernel(x_ptr, wr_ptr, bias_ptr, lg_ptr, wf_ptr, f_ptr, w1_ptr, w3_ptr, hp_ptr, w2_ptr, yl_ptr,
                      nw_ptr, wu_ptr, wsd_ptr, out_ptr, sync_ptr, E, scaling, eps, beta, lbeta,
                      D: tl.constexpr, DP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, S: tl.constexpr,
                      SP: tl.constexpr, I: tl.constexpr, IP: tl.constexpr, TOPK: tl.constexpr, BE: tl.constexpr,
                      RB: tl.constexpr, FB: tl.constexpr, UB: tl.constexpr, DB: tl.constexpr, TB: tl.constexpr,
                      RENORM: tl.constexpr, SITU: tl.constexpr, STAGE: tl.constexpr, PDL: tl.constexpr,
                      L2: tl.constexpr):
    """x [D] -> out [D]. Scratch: lg [E] fp32 logits, f [L + 2 S] (the latent h, the shared gate and up), hp [TOPK, I]
    (the experts' activations), yl [L] (the routed sum in the latent space). STAGE -1: the whole block, barriers
    between the stages (every program resident); 0 .. 4: that stage alone (the interpreter's launches). L2 (one
    launch only): the tail's weight tiles are asked into L2 at the start, the down tiles once the routing is known,
    so that their loads after the up and down stages hit L2 rather than HBM."""
    g = tl.program_id(0)
    G = tl.num_programs(0)
    ALL: tl.constexpr = STAGE < 0
    dt = out_ptr.dtype.element_ty
    cd = tl.arange(0, DP)
    F: tl.constexpr = L + 2 * S
    if PDL:
        gdc_launch_dependents()
    # ---- stage 0, router logits (fp32 weights), rows [g RB, (g + 1) RB); the front tile is loaded first
    cl = tl.arange(0, LP)
    cs = tl.arange(0, SP)
    trows = g * TB + tl.arange(0, TB)
    drows = g * DB + tl.arange(0, DB)
    if ALL and L2:
        _prefetch_l2(wu_ptr, trows, D, L, LP)
        _prefetch_l2(wsd_ptr, trows, D, S, SP)
    frows = g * FB + tl.arange(0, FB)
    if ALL or STAGE == 1:
        wf = tl.load(wf_ptr + frows[:, None].to(tl.int64) * D + cd[None, :],
                     mask=(frows[:, None] < F) & (cd[None, :] < D), other=0.0)
    if PDL:
        gdc_wait()
    x = tl.load(x_ptr + cd, mask=cd < D, other=0.0).to(tl.float32)
    if ALL or STAGE == 0:
        rrows = g * RB + tl.arange(0, RB)
        if g * RB < E:
            wr = tl.load(wr_ptr + rrows[:, None].to(tl.int64) * D + cd[None, :],
                         mask=(rrows[:, None] < E) & (cd[None, :] < D), other=0.0)
            tl.store(lg_ptr + rrows, tl.sum(wr.to(tl.float32) * x[None, :], 1), mask=rrows < E)
        if ALL:
            _arrive(sync_ptr)
    # ---- stage 1, the front GEMV: rows [g FB, (g + 1) FB) of [h; gate; up]
    if ALL or STAGE == 1:
        fy = tl.sum(wf.to(tl.float32) * x[None, :], 1)
        tl.store(f_ptr + frows, fy.to(dt), mask=frows < F)
        if ALL:
            _arrive(sync_ptr + 1)
    # ---- stage 2, expert up: pair j = g UB // I (slot j of the top-k), its rows [(g UB) % I, + UB)
    if ALL or STAGE >= 2:
        if ALL:
            _wait(sync_ptr, G)
        ids, wv = _route_row(lg_ptr, bias_ptr, 0, E, scaling, TOPK, True, RENORM, BE)
    if ALL or STAGE == 2:
        j = (g * UB) // I
        e = tl.sum(tl.where(tl.arange(0, TOPK) == j, ids, 0), 0)
        urows = (g * UB) % I + tl.arange(0, UB)
        on = (j < TOPK) & (urows[:, None] < I) & (cl[None, :] < L)
        uoff = (e * I + urows[:, None]) * L + cl[None, :]
        w1 = tl.load(w1_ptr + uoff, mask=on, other=0.0)
        w3 = tl.load(w3_ptr + uoff, mask=on, other=0.0)
        if ALL and L2:
            for jd in tl.static_range(TOPK):
                ed = tl.sum(tl.where(tl.arange(0, TOPK) == jd, ids, 0), 0)
                _prefetch_l2(w2_ptr + ed * L * I, drows, L, I, IP)
        if ALL:
            _wait(sync_ptr + 1, G)
        h = tl.load(f_ptr + cl, mask=cl < L, other=0.0, cache_modifier=".cg").to(tl.float32)
        a = tl.sum(w1.to(tl.float32) * h[None, :], 1).to(dt).to(tl.float32)
        b = tl.sum(w3.to(tl.float32) * h[None, :], 1).to(dt).to(tl.float32)
        tl.store(hp_ptr + j * I + urows, _act(a, b, beta, lbeta, SITU).to(dt), mask=(j < TOPK) & (urows < I))
        if ALL:
            _arrive(sync_ptr + 2)
    # ---- stage 3, expert down: latent rows [g DB, (g + 1) DB) of the k experts, weighted and summed
    if ALL or STAGE == 3:
        ci = tl.arange(0, IP)
        jj = tl.arange(0, TOPK)
        w2 = tl.load(w2_ptr + (ids[:, None, None] * L + drows[None, :, None]) * I + ci[None, None, :],
                     mask=(drows[None, :, None] < L) & (ci[None, None, :] < I), other=0.0)
        if ALL:
            _wait(sync_ptr + 2, G)
        hv = tl.load(hp_ptr + jj[:, None] * I + ci[None, :], mask=ci[None, :] < I, other=0.0,
                     cache_modifier=".cg").to(tl.float32)
        y = tl.sum(w2.to(tl.float32) * hv[:, None, :], 2)  # [TOPK, DB]
        acc = tl.sum(y.to(dt).to(tl.float32) * wv.to(dt).to(tl.float32)[:, None], 0)
        tl.store(yl_ptr + drows, acc.to(dt), mask=drows < L)
        if ALL:
            _arrive(sync_ptr + 3)
    # ---- stage 4, the tail: rows [g TB, (g + 1) TB) of W_up RMSNorm(yl) + W_sd act(gate, up), each rounded
    if ALL or STAGE == 4:
        wu = tl.load(wu_ptr + trows[:, None].to(tl.int64) * L + cl[None, :],
                     mask=(trows[:, None] < D) & (cl[None, :] < L), other=0.0)
        wsd = tl.load(wsd_ptr + trows[:, None].to(tl.int64) * S + cs[None, :],
                      mask=(trows[:, None] < D) & (cs[None, :] < S), other=0.0)
        if ALL:
            _wait(sync_ptr + 3, G)
        yn = _input_row(yl_ptr, yl_ptr, nw_ptr, 0, 0, 0, cl, 1, L, LP, eps, beta, lbeta, 2, SITU, 1)
        sa = _input_row(f_ptr + L, f_ptr + L + S, nw_ptr, 0, 0, 0, cs, 1, S, SP, eps, beta, lbeta, 1, SITU, 1)
        ya = tl.sum(wu.to(tl.float32) * yn[None, :], 1)
        yb = tl.sum(wsd.to(tl.float32) * sa[None, :], 1)
        tl.store(out_ptr + trows, (yb.to(dt).to(tl.float32) + ya.to(dt).to(tl.float32)).to(dt), mask=trows < D)
    if ALL:  # the last program out re-arms the counters for the next launch
        if tl.atomic_add(sync_ptr + 4, 1) == G - 1:
            for k in tl.static_range(5):
                tl.atomic_xchg(sync_ptr + k, 0)


def _pow2_ceil_div(a: int, b: int) -> int:
    return triton.next_power_of_2(triton.cdiv(a, b))


class PersistentMoE:
    """One latent MoE block launched as one persistent kernel of `programs` programs, with its scratch and counters:
    the router's fp32 weight [E, D] and its Routing, the front GEMM's weight [L + 2 S, D] (latent down projection,
    shared gate, shared up: the model's fused buffer), dense experts w1, w3 [E, I, L] and w2 [E, L, I], the latent
    RMSNorm (weight [L], eps), the latent up projection [D, L] and the shared down projection [D, S]."""

    def __init__(self, router_weight: torch.Tensor, routing, front_weight: torch.Tensor, w1: torch.Tensor,
                 w3: torch.Tensor, w2: torch.Tensor, norm_weight: torch.Tensor, eps: float, up_weight: torch.Tensor,
                 shared_down_weight: torch.Tensor, act, programs: int):
        self.E, self.I, self.L = w1.shape
        self.D, self.S = shared_down_weight.shape
        r = routing
        assert route_row_serves(r, self.E, front_weight.dtype) and r.correction_bias is not None
        assert front_weight.shape == (self.L + 2 * self.S, self.D) and up_weight.shape == (self.D, self.L)
        assert all(t.is_contiguous() for t in (router_weight, front_weight, w1, w3, w2, up_weight, shared_down_weight))
        self.topk, self.renorm, self.scaling = r.top_k, bool(r.renormalize) and r.top_k > 1, float(r.scaling)
        self.bias, self.wr, self.wf = r.correction_bias, router_weight, front_weight
        self.w1, self.w3, self.w2 = w1, w3, w2
        self.nw, self.eps, self.wu, self.wsd, self.act = norm_weight, float(eps), up_weight, shared_down_weight, act
        dev, dt = front_weight.device, front_weight.dtype
        self.lg = torch.empty(self.E, dtype=torch.float32, device=dev)
        self.f = torch.empty(self.L + 2 * self.S, dtype=dt, device=dev)
        self.hp = torch.empty(self.topk, self.I, dtype=dt, device=dev)
        self.yl = torch.empty(self.L, dtype=dt, device=dev)
        self.sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=dev)
        G = self.G = programs
        self.tiles = dict(RB=_pow2_ceil_div(self.E, G), FB=_pow2_ceil_div(self.L + 2 * self.S, G),
                          UB=_pow2_ceil_div(self.topk * self.I, G), DB=_pow2_ceil_div(self.L, G),
                          TB=_pow2_ceil_div(self.D, G))
        assert self.I % self.tiles["UB"] == 0, "an up tile must lie within one expert"
        for name, n in (("FB", self.L + 2 * self.S), ("UB", self.topk * self.I), ("DB", self.L), ("TB", self.D)):
            assert triton.cdiv(n, self.tiles[name]) <= G

    def _launch_args(self, x: torch.Tensor, out: torch.Tensor):
        a = self.act
        args = (x, self.wr, self.bias, self.lg, self.wf, self.f, self.w1, self.w3, self.hp, self.w2, self.yl,
                self.nw, self.wu, self.wsd, out, self.sync, self.E, self.scaling, self.eps, float(a.beta),
                float(a.linear_beta))
        P2 = triton.next_power_of_2
        meta = dict(D=self.D, DP=P2(self.D), L=self.L, LP=P2(self.L), S=self.S, SP=P2(self.S), I=self.I, IP=P2(self.I),
                    TOPK=self.topk, BE=P2(self.E), RENORM=self.renorm, SITU=a.kind == "situ", **self.tiles)
        return args, meta

    def resident(self, x: torch.Tensor, warps: int, pdl: bool = True, l2: bool = False) -> int:
        """How many programs of the one-launch form the device holds at once (compiled, not launched): a grid larger
        than this would wait at its first barrier forever."""
        args, meta = self._launch_args(x, torch.empty_like(x))
        k = _moe_block_kernel.warmup(*args, **meta, STAGE=-1, PDL=pdl, L2=l2, num_warps=warps, launch_pdl=pdl,
                                     grid=(1,))
        k._init_handles()
        props = torch.cuda.get_device_properties(x.device)
        regs_warp = -(-k.n_regs * 32 // 256) * 256  # (registers are allocated a warp at a time, 256 at a time)
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_warp * warps)
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
        by_smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024) // max(k.metadata.shared, 1)
        per_sm = min(by_regs, by_threads, by_smem)
        self.occupancy = (f"{k.n_regs} registers a thread, {k.n_spills} spilled, {k.metadata.shared} B shared a "
                          f"program: {per_sm} programs an SM")
        return per_sm * props.multi_processor_count

    def __call__(self, x: torch.Tensor, stages: bool = False, pdl: bool = False, warps: int = 8,
                 l2: bool = False) -> torch.Tensor:
        """x [1, D] -> [1, D]. stages: five launches, one a stage (the interpreter's form); l2: see the kernel."""
        assert x.shape == (1, self.D) and x.dtype == self.wf.dtype
        if x.stride(-1) != 1:
            x = x.contiguous()
        out = torch.empty_like(x)
        args, meta = self._launch_args(x, out)
        for stage in (range(5) if stages else (-1,)):
            launch(_moe_block_kernel, (self.G,), *args, **meta, STAGE=stage, PDL=pdl, L2=l2 and not stages,
                   num_warps=warps, launch_pdl=pdl)
        return out
