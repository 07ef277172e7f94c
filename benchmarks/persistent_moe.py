"""The latent MoE block of one decode token as one persistent kernel, against the model's five PDL launches
(docs/kernels.md, "Targets: met and missed", next steps 1 and 2).

At batch 1 the model's MoE block is a chain of five launches: router logits, the front GEMV (latent down projection
and the shared experts' gate and up), the expert up GEMV (routing inside), the expert down GEMV, and the paired tail
(latent norm + up projection, plus the shared experts' activation + down projection). `_moe_block_kernel` runs the
same five stages in one launch whose programs are all resident at once, with grid-wide barriers (acquire/release
counters in global memory) in place of the kernel boundaries. Each program owns one tile of every stage, and loads
the next stage's weight tile before it waits wherever that tile does not depend on the wait:
- the front tile before the router row, so the router's barrier overlaps it;
- the chosen experts' up tile (routing from the finished logits) before the front's barrier;
- the down tile (the same routing) before the up stage's barrier;
- the tail tile before the down stage's barrier.

Under the interpreter (a CPU) the stages run as five launches (STAGE = 0 .. 4): programs run one after another
there, so a barrier would wait forever. The arithmetic is the same code either way.

    PYTHONPATH=. python benchmarks/persistent_moe.py --layers 23 --programs 256
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kestrel.ops.linear.triton import _input_row
from kestrel.ops.moe.triton import _route_row
from kestrel.ops.triton_utils import act as _act

# the counters of one launch: one per barrier (arrivals may run ahead of another barrier's waits), and the exit count
SYNC_WORDS = 5


@triton.jit
def _arrive(sync_ptr):
    """This program's stores are done: count it in (release: every thread's stores before the count)."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release")


@triton.jit
def _wait(sync_ptr, G):
    """Spin until all G programs have arrived (acquire: their released stores are visible after it)."""
    c = tl.atomic_add(sync_ptr, 0, sem="acquire")
    while c < G:
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
    """One MoE block's weights, gathered from a kestrel.models.moe.MoE (latent, with a latent norm and shared experts,
    dense experts), with its scratch and counters, launched as one persistent kernel of `programs` programs."""

    def __init__(self, moe, programs: int):
        e = moe.experts
        se = moe.shared_experts
        self.D = moe.routed_expert_up_proj.weight.shape[0]
        self.L = moe.routed_expert_down_proj.weight.shape[0]
        self.S = se.gate_proj.weight.shape[0]
        self.E, self.I, _ = e.w1.shape
        r = moe.gate.routing()
        assert r.num_expert_group <= r.topk_group and r.top_k & (r.top_k - 1) == 0
        self.topk, self.renorm, self.scaling = r.top_k, bool(r.renormalize) and r.top_k > 1, float(r.scaling)
        self.bias = r.correction_bias
        self.wr = moe.gate.weight
        self.wf = torch.cat([moe.routed_expert_down_proj.weight, se.gate_proj.weight, se.up_proj.weight]).contiguous()
        self.w1, self.w3, self.w2 = e.w1.data, e.w3.data, e.w2.data
        self.nw, self.eps = moe.routed_expert_norm.weight, float(moe.routed_expert_norm.eps)
        self.wu, self.wsd = moe.routed_expert_up_proj.weight, se.down_proj.weight
        self.act = moe.act
        dev, dt = self.wf.device, self.wf.dtype
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
        print(f"  {k.n_regs} registers a thread, {k.n_spills} spilled, {k.metadata.shared} B shared a program: "
              f"{min(by_regs, by_threads, by_smem)} programs an SM")
        return min(by_regs, by_threads, by_smem) * props.multi_processor_count

    def __call__(self, x: torch.Tensor, stages: bool = False, pdl: bool = False, warps: int = 8,
                 l2: bool = False) -> torch.Tensor:
        """x [1, D] -> [1, D]. stages: five launches, one a stage (the interpreter's form); l2: see the kernel."""
        out = torch.empty_like(x)
        args, meta = self._launch_args(x, out)
        for stage in (range(5) if stages else (-1,)):
            _moe_block_kernel[(self.G,)](*args, **meta, STAGE=stage, PDL=pdl, L2=l2 and not stages, num_warps=warps,
                                         launch_pdl=pdl)
        return out


def k3_moe(preset: str, device, dtype, seed: int = 0):
    """A MoE block of the preset's shapes with random weights (a router that spreads the tokens), fused for decode."""
    from kestrel.models.moe import MoE
    from kestrel.models.presets import preset_config

    torch.manual_seed(seed)
    cfg = preset_config(preset)
    moe = MoE(cfg, dtype=dtype).to(device)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
        moe.gate.e_score_correction_bias.normal_(0, 0.1)
    moe.fuse_projections()
    return moe


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    from benchmarks.common import copy_bandwidth, replay_ms, stamp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--layers", type=int, default=23, help="MoE blocks in the chain (k3-mini has 23)")
    ap.add_argument("--configs", default="1x:16,1x:16:l2,1x:32:l2,2x:8:l2",
                    help="persistent kernels to time, comma-separated PROGRAMS:WARPS[:l2]; PROGRAMS as a count or as "
                         "a multiple of the SMs (2x); l2: the tail and down tiles asked into L2 early")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="turn-about rounds (medians reported)")
    args = ap.parse_args()
    import kestrel.ops

    kestrel.ops.PDL = True
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = copy_bandwidth()
    blocks = [k3_moe(args.preset, dev, torch.bfloat16, seed=i) for i in range(args.layers)]
    moe0 = blocks[0]
    nbytes = sum(p.numel() * p.element_size() for n, p in moe0.named_parameters() if "experts.w" not in n)
    e = moe0.experts
    nbytes += e.w1.shape[1] * e.w1.shape[2] * 2 * 3 * moe0.gate.routing().top_k  # the chosen experts' w1, w3, w2
    floor_ms = args.layers * nbytes / bw * 1e3
    print(f"{stamp()} {torch.cuda.get_device_name(dev)}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"{args.layers} {args.preset} MoE blocks a chain, {nbytes / 1e6:.1f} MB a block read, floor {floor_ms:.3f} ms")
    x0 = torch.randn(1, moe0.routed_expert_up_proj.weight.shape[0], device=dev).to(torch.bfloat16)

    def model_chain():
        y = x0
        for m in blocks:  # (each block's output is the next one's input: magnitudes stay O(1) with these weights)
            y = m(y)
        return y

    sides = {"model (5 PDL launches a block)": model_chain}
    per = {}
    for conf in args.configs.split(","):
        progs, w, *opt = conf.split(":")
        G, w, l2 = int(float(progs[:-1]) * sms) if progs.endswith("x") else int(progs), int(w), opt == ["l2"]
        ps = [PersistentMoE(m, G) for m in blocks]
        name = f"persistent, {G} programs x {w} warps{', L2 prefetch' if l2 else ''}"
        resident = ps[0].resident(x0, w, l2=l2)
        if resident < G:
            print(f"{name}: skipped, only {resident} programs can be resident at once")
            continue

        def chain(ps=ps, w=w, l2=l2):
            y = x0
            for p in ps:
                y = p(y, pdl=True, warps=w, l2=l2)
            return y

        sides[name], per[name] = chain, (ps, dict(pdl=True, warps=w, l2=l2))
    with torch.no_grad():
        # the check: each of the first blocks on the model chain's own input to it, against the model's block
        ins = [x0]
        for m in blocks[:3]:
            ins.append(m(ins[-1]))
        graphs = {}
        for name, run in sides.items():
            ps, form = per.get(name, ((), {}))
            errs = [rel_err(p(xi, **form), ins[i + 1]) for i, (p, xi) in enumerate(zip(ps[:3], ins))]
            run()
            torch.cuda.synchronize()
            ok = all(err < 3e-2 for err in errs) and all(bool(p.sync.eq(0).all()) for p in ps)
            print(f"{name}: rel err of blocks 0-2 vs the model's {' '.join(f'{e:.2e}' for e in errs)}"
                  f"{'' if ok else '  ** FAILED: not timed'}")
            if not ok:
                continue
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            graphs[name] = g
        times = {name: [] for name in graphs}
        for _ in range(args.rounds):
            for name, g in graphs.items():
                times[name].append(replay_ms(g, args.replays))
    base = statistics.median(times[next(iter(times))]) if times else float("nan")
    print("| chain | ms | of floor | vs model | us a block |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t:.3f} | {floor_ms / t:.1%} | {base / t:.3f}x | {t * 1e3 / args.layers:.2f} |")


if __name__ == "__main__":
    main()
