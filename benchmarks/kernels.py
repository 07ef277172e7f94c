"""Kernel table: Kestrel's Triton kernels against flash-linear-attention (chunk_kda, fused_recurrent_kda) and
torch, on k3-mini / K3 kernel shapes. Prints a markdown table last.

  PYTHONPATH=. python benchmarks/kernels.py [--out DIR] [--quick]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (Log, cuda_time, graph_time, host_time, kernel_breakdown, kernel_times,  # noqa: E402
                               stamp, timeline)
from kestrel.ops.kda import reference as kref  # noqa: E402
from kestrel.ops.kda import triton as kda_t  # noqa: E402
from kestrel.ops.mla import triton as mla_t  # noqa: E402
from kestrel.ops.moe import reference as moe_ref  # noqa: E402
from kestrel.ops.moe import triton as moe_t  # noqa: E402

BF = torch.bfloat16
ROWS = []


def row(log, name, shape, ours, other=None, other_name="", note=""):
    ratio = f"{other / ours:.2f}x" if other else ""
    ROWS.append((name, shape, ours, other_name, other, ratio, note))
    log(f"{name:<24} {shape:<34} ours {ours * 1e6:9.1f} us  {other_name} {other * 1e6 if other else 0:9.1f} us "
        f"{ratio} {note}")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


CHUNK_SWEEP = [{"rec_longest_first": False}, {"rec_bv": 32}, {"rec_warps": 2}, {"rec_warps": 8}, {"rec_stages": 1},
               {"rec_stages": 3}, {"rec_bv": 32, "rec_warps": 2}, {"gate_cols": 64}, {"wy_warps": 8}]


def _per_kernel(times) -> str:
    """'name us, ...' for our kernels (leading underscore and trailing _kernel dropped)."""
    return ", ".join(f"{n.strip('_').removesuffix('_kernel')} {t:.0f}" for n, (_, t) in times.items())


def chunk_sweep(log, run):
    """GPU kernel time of run under each CHUNK_SWEEP change to kda_chunked's launch shapes (one at a time; kernel
    time, so the host's share of the wall time does not blur the comparison), per kernel, and how far its output
    moves from the defaults'; defaults restored after each."""
    from kestrel.ops.kda import triton_chunk as tc
    base = dict(tc.TILES)
    k0 = kernel_times(run)
    t0 = sum(t for _, t in k0.values())
    o0 = run()[0]
    log(f"  chunk sweep (kernel time): defaults {base}: {t0:.1f} us ({_per_kernel(k0)})")
    for change in CHUNK_SWEEP:
        tc.TILES.update(change)
        try:
            kt = kernel_times(run)
            t = sum(t for _, t in kt.values())
            log(f"  chunk sweep (kernel time): {change}: {t:.1f} us ({t0 / t:.3f}x the defaults; "
                f"output vs the defaults' {rel(run()[0], o0):.1e}; {_per_kernel(kt)})")
        except Exception as e:
            log(f"  chunk sweep: {change} failed: {type(e).__name__}: {str(e)[:100]}")
        tc.TILES.clear()
        tc.TILES.update(base)


def host_profile(log, run, top: int = 12):
    """Where the host's time to issue run goes (cProfile over 20 calls, by own time)."""
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        run()
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    for line in buf.getvalue().splitlines():
        if line.strip():
            log("  host | " + line)


def chunk_case(H: int, K: int = 128, lens=(1000, 3000, 192, 4000)):
    """The chunked-prefill benchmark's inputs (T = 8192 varlen by default, bf16, safe gates down to the bound, an
    initial state): (cu_seqlens list, q, k, v, g, beta, h0)."""
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    T = cu[-1]
    q = kref.l2norm(torch.randn(T, H, K, device="cuda")).to(BF)
    k = kref.l2norm(torch.randn(T, H, K, device="cuda")).to(BF)
    v = torch.randn(T, H, K, device="cuda").to(BF)
    g = -5 * torch.rand(T, H, K, device="cuda")
    beta = torch.rand(T, H, device="cuda")
    h0 = torch.randn(len(lens), H, K, K, device="cuda") * 0.1
    return cu, q, k, v, g, beta, h0


def fla_chunk(fla, case, safe: bool, new_cu: bool = False):
    """A closure running fla's chunk_kda on a chunk_case (safe_gate with its -5 bound, or plain), its cu_seqlens
    tensor made once (fla caches its chunk indices per tensor) or, with new_cu, made anew every call."""
    cu, q, k, v, g, beta, h0 = case
    cu_t = torch.tensor(cu, device="cuda", dtype=torch.long)

    def run():
        c = torch.tensor(cu, device="cuda", dtype=torch.long) if new_cu else cu_t
        return fla.chunk_kda(q[None], k[None], v[None], g[None], beta[None], scale=q.shape[-1]**-0.5,
                             initial_state=h0, output_final_state=True, cu_seqlens=c, safe_gate=safe,
                             lower_bound=-5.0 if safe else None)
    return run


def chunk_host_variants(log, fla, case, H):
    """Wall and host-issue time of one call with its launch path or metadata varied: ours as shipped (chunk table
    cached per layout, compiled kernels launched directly), with Triton's JIT launches, with a new layout every call
    (table built and copied each time); fla's safe_gate with its cu_seqlens tensor reused (its chunk indices cached)
    and with a new cu_seqlens tensor every call, as a server step would have."""
    from kestrel.ops.kda import triton_chunk as tc
    cu, q, k, v, g, beta, h0 = case

    def ours():
        return tc.kda_chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)

    def fresh():
        tc._TABLES.clear()
        return ours()

    def jit_launches():
        saved = tc.launch
        tc.launch = lambda fn, grid, *args, **meta: fn[grid](*args, **meta)
        try:
            return ours()
        finally:
            tc.launch = saved

    sides = [("ours", ours), ("ours, JIT launches", jit_launches), ("ours, new layout each call", fresh)]
    if fla is not None:
        sides += [("fla safe_gate", fla_chunk(fla, case, True)),
                  ("fla safe_gate, new cu_seqlens each call", fla_chunk(fla, case, True, new_cu=True))]
    for label, fn in sides:
        try:
            log(f"  host variants H={H}: {label}: wall {cuda_time(fn, iters=10) * 1e6:.1f} us, "
                f"host issue {host_time(fn) * 1e6:.1f} us")
        except Exception as e:
            log(f"  host variants H={H}: {label} failed: {type(e).__name__}: {str(e)[:100]}")


def bench_chunk(log, fla, quick, heads=(16, 32, 96), sweep=False):
    timelines = []  # taken last: the CPU-side profiler slows the host's later launches
    for H in heads:
        case = chunk_case(H)
        cu, q, k, v, g, beta, h0 = case
        N = len(cu) - 1

        def run_ours(q=q, k=k, v=v, g=g, beta=beta, h0=h0):  # bound now: timelines call it after the loop
            return kda_t.kda_chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)

        ours = cuda_time(run_ours, iters=10)
        o, f = run_ours()
        kernel_breakdown(run_ours, log, label=f"kda_chunked H={H}")
        log(f"kda_chunked H={H}: wall {ours * 1e6:.1f} us, host issue {host_time(run_ours) * 1e6:.1f} us")
        timelines.append((f"kda_chunked H={H}", run_ours))
        if sweep:
            chunk_sweep(log, run_ours)
            host_profile(log, run_ours)
        other, note = None, ""
        if fla is not None:
            for safe in (False, True):
                run = fla_chunk(fla, case, safe)
                try:
                    t = cuda_time(run, iters=10)
                    fo, ff = run()
                    kernel_breakdown(run, log, label=f"fla chunk_kda safe_gate={safe} H={H}")
                    log(f"fla safe_gate={safe} H={H}: wall {t * 1e6:.1f} us, host issue {host_time(run) * 1e6:.1f} us")
                    timelines.append((f"fla safe_gate={safe} H={H}", run))
                    note += f" fla{'(safe_gate)' if safe else ''} {t * 1e6:.0f}us, o vs fla {rel(o, fo[0]):.1e};"
                    other = t if other is None else min(other, t)
                except Exception as e:
                    note += f" fla safe={safe} failed: {type(e).__name__}: {str(e)[:80]};"
        row(log, "kda_chunked", f"T=8192 varlen({N}) H={H} K=V=128", ours, other, "fla chunk_kda(best)", note)
        chunk_host_variants(log, fla, case, H)
    for label, run in timelines:
        timeline(run, log, label)


def bench_decode(log, fla, quick):
    H, K, W = 16, 128, 4
    for B in ([1, 32] if quick else [1, 4, 16, 64, 256]):
        S = B + 1
        mixed = torch.randn(B, 3 * H * K, device="cuda").to(BF)
        cw = (torch.randn(3 * H * K, W, device="cuda") * 0.5).to(BF)
        conv = torch.randn(S, W - 1, 3 * H * K, device="cuda").to(BF)
        ssm = torch.randn(S, H, K, K, device="cuda") * 0.1
        slots = torch.arange(1, B + 1, device="cuda")
        raw = torch.randn(B, H, K, device="cuda").to(BF)
        A, dtb, beta = torch.randn(H, device="cuda"), torch.randn(H * K, device="cuda"), torch.rand(B, H, device="cuda")

        def ours_fn():
            return kda_t.kda_decode(mixed, cw, conv, ssm, slots, raw, A, dtb, -5.0, beta, K**-0.5)

        ours = cuda_time(ours_fn, iters=50)
        note = f"graph {graph_time(ours_fn) * 1e6:.1f}us/step (incl. conv, gate, l2norm)"
        other = None
        if fla is not None:
            qkv = mixed.view(B, 1, 3, H, K)
            st = ssm[1:].contiguous()
            try:
                def fla_fn():
                    return fla.fused_recurrent_kda(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], raw.view(B, 1, H, K),
                                                   beta.view(B, 1, H), A_log=A, dt_bias=dtb, scale=K**-0.5,
                                                   initial_state=st, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                   lower_bound=-5.0)
                other = cuda_time(fla_fn, iters=50)
                note += f"; fla graph {graph_time(fla_fn) * 1e6:.1f}us (no conv)"
            except Exception as e:
                note += f"; fla failed: {type(e).__name__}: {str(e)[:80]}"
        row(log, "kda_decode", f"B={B} H=16 K=V=128", ours, other, "fla fused_recurrent_kda", note)


def bench_mla(log, quick):
    H, R, DR, PS = 16, 512, 64, 64
    for B, ctx in ([(1, 1024), (32, 4096)] if quick else [(1, 1024), (1, 32768), (32, 4096), (128, 2048)]):
        pages = -(-ctx // PS)
        kv = torch.randn(B * pages + 1, PS, R + DR, device="cuda").to(BF)
        pt = (torch.arange(B * pages, device="cuda").view(B, pages) + 1).int()
        sl = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
        ql, qr = torch.randn(B, H, R, device="cuda").to(BF), torch.randn(B, H, DR, device="cuda").to(BF)
        t = cuda_time(lambda: mla_t.mla_decode_paged(ql, qr, kv, pt, sl, R, 0.07), iters=30)
        gbs = B * ctx * (R + DR) * 2 / t / 1e9
        row(log, "mla_decode_paged", f"B={B} ctx={ctx} H=16 page=64", t, note=f"{gbs:.0f} GB/s of latents")
    for Tq in ([2048] if quick else [2048, 8192]):
        H, DK, DV = 16, 192, 128
        q = torch.randn(Tq, H, DK, device="cuda").to(BF)
        k = torch.randn(Tq, H, DK, device="cuda").to(BF)
        v = torch.randn(Tq, H, DV, device="cuda").to(BF)
        t = cuda_time(lambda: mla_t.attention_with_lse(q, k, v, DK**-0.5, 0), iters=10)
        sdpa = cuda_time(lambda: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=DK**-0.5), iters=10)
        flops = 2 * Tq * Tq * H * (DK + DV) / 2
        row(log, "attention_with_lse", f"T={Tq} H=16 Dk=192 Dv=128 causal", t, sdpa, "torch SDPA (no lse)",
            f"{flops / t / 1e12:.0f} TFLOP/s")


def bench_gemv(log):
    """Decode-batch (M = 1) linears of k3-mini: the Triton GEMV probe against cuBLAS, both inside CUDA graphs."""
    from kestrel.ops.linear import triton as lin_t

    for N, K, what in [(8336, 2048, "KDA fused in-proj"), (2048, 2048, "o_proj"), (3072, 2048, "MoE front end"),
                       (2048, 1024, "latent up"), (32000, 2048, "lm_head")]:
        w = torch.randn(N, K, device="cuda").to(BF)
        x = torch.randn(1, K, device="cuda").to(BF)
        err = rel(lin_t.linear(x, w), torch.nn.functional.linear(x.float(), w.float()))
        ours = graph_time(lambda: lin_t.linear(x, w))
        cub = graph_time(lambda: torch.nn.functional.linear(x, w))
        row(log, "gemv (probe, M=1)", f"{what} {N}x{K}", ours, cub, "cuBLAS F.linear",
            f"{N * K * 2 / ours / 1e12:.2f} vs {N * K * 2 / cub / 1e12:.2f} TB/s; rel err {err:.1e}")


def bench_cold(log):
    """Decode-batch GEMVs with the weights streamed from HBM, as in the model: each graph cycles through enough
    copies of a weight (or of an expert set) to overflow the 60 MB L2. Sweeps the tiles; cuBLAS alongside."""
    from kestrel.models.layers.linear import ExpertWeights
    from kestrel.ops.linear import triton as lin_t

    def cycle(fn, n):
        return lambda: [fn(i) for i in range(n)]

    for N, K, what in [(8336, 2048, "KDA fused in-proj"), (2048, 2048, "o_proj"), (2048, 1024, "latent up")]:
        n = max(2, (256 << 20) // (N * K * 2))
        ws = [torch.randn(N, K, device="cuda").to(BF) for _ in range(n)]
        for M in (1, 8):
            x = torch.randn(M, K, device="cuda").to(BF)
            cub = graph_time(cycle(lambda i: torch.nn.functional.linear(x, ws[i]), n), iters=4) / n
            for tile in ((4, 512), (8, 512), (16, 256), (8, 256), (16, 512)):
                lin_t.TILE = tile
                t = graph_time(cycle(lambda i: lin_t.linear(x, ws[i]), n), iters=4) / n
                row(log, f"gemv cold M={M} tile={tile}", f"{what} {N}x{K}", t, cub, "cuBLAS",
                    f"{N * K * 2 / t / 1e12:.2f} vs {N * K * 2 / cub / 1e12:.2f} TB/s")
            lin_t.TILE = None
        ws = None
    E, D, I, k = 128, 1024, 512, 8
    act = moe_ref.Activation("situ", 4.0, 25.0)
    sets = []
    for _ in range(6):
        ew = ExpertWeights(E, D, I, False, BF).cuda()
        with torch.no_grad():
            for name in ("w1", "w2", "w3"):
                getattr(ew, name).normal_(std=0.03)
        sets.append(ew)
    x = torch.randn(1, D, device="cuda").to(BF)
    routes = [moe_t.route(torch.randn(1, E, device="cuda"), None, k, True, 2.5) for _ in sets]
    up0, down0 = moe_t.GEMV_UP_ROWS, moe_t.GEMV_DOWN_ROWS
    wbytes = k * 3 * D * I * 2
    for up in (4, 8, 16):
        for down in (2, 4, 8):
            moe_t.GEMV_UP_ROWS, moe_t.GEMV_DOWN_ROWS = (up, up), down
            step = cycle(lambda i: moe_t.moe_experts(x, sets[i], *routes[i], act), len(sets))
            t = graph_time(step, iters=4) / len(sets)
            row(log, f"moe gemv cold up={up} down={down}", "T=1 E=128 k=8 1024<->512", t,
                note=f"{wbytes / t / 1e12:.2f} TB/s of expert weights")
    moe_t.GEMV_UP_ROWS, moe_t.GEMV_DOWN_ROWS = up0, down0


def bench_mla_splits(log):
    """Split count of the paged MLA decode at batch 1, ctx 1024 (the ladder's shape), graph-timed."""
    H, R, DR, PS, ctx = 16, 512, 64, 64, 1024
    pages = ctx // PS + 1
    kv = torch.randn(pages + 1, PS, R + DR, device="cuda").to(BF)
    pt = (torch.arange(pages, device="cuda").view(1, pages) + 1).int()
    sl = torch.full((1,), ctx + 1, device="cuda", dtype=torch.int32)
    ql, qr = torch.randn(1, H, R, device="cuda").to(BF), torch.randn(1, H, DR, device="cuda").to(BF)
    default = mla_t.num_splits
    try:
        for ns in (default(1, 1, pages * PS), 17, 33):
            mla_t.num_splits = lambda *a, ns=ns: ns
            t = graph_time(lambda: mla_t.mla_decode_paged(ql, qr, kv, pt, sl, R, 0.07))
            row(log, "mla_decode splits", f"B=1 ctx={ctx} splits={ns}", t, note="graph-timed, both launches")
    finally:
        mla_t.num_splits = default


def bench_moe(log, quick):
    from kestrel.models.layers.linear import ExpertWeights
    from kestrel.ops.mxfp4 import reference as mx

    E, D, I, k = 128, 1024, 512, 8
    act = moe_ref.Activation("situ", 4.0, 25.0)
    for quant in (False, True):
        ew = ExpertWeights(E, D, I, quant, BF).cuda()
        with torch.no_grad():
            for n, (o, i) in {"w1": (I, D), "w2": (D, I), "w3": (I, D)}.items():
                w = torch.randn(E, o, i, device="cuda") / i**0.5
                if quant:
                    pk, sc = mx.quantize(w.flatten(0, 1))
                    getattr(ew, n + "_packed").copy_(pk.view(E, o, -1))
                    getattr(ew, n + "_scale").copy_(sc.view(E, o, -1))
                else:
                    getattr(ew, n).copy_(w)
        for T in ([1, 256] if quick else [1, 8, 64, 512, 4096]):
            x = torch.randn(T, D, device="cuda").to(BF)
            wts, ids = moe_t.route(torch.randn(T, E, device="cuda"), None, k, True, 2.5)
            t = cuda_time(lambda: moe_t.moe_experts(x, ew, wts, ids, act), iters=20)
            nexp = int(torch.unique(ids).numel())
            wbytes = nexp * 3 * D * I * (0.5 + 1 / 32 if quant else 2)
            row(log, "moe_experts" + (" mxfp4" if quant else ""), f"T={T} E=128 k=8 {D}<->{I}", t,
                note=f"{wbytes / t / 1e9:.0f} GB/s of expert weights ({nexp} experts)")
    for T in (1, 256):
        lg = torch.randn(T, 128, device="cuda")
        bias = torch.randn(128, device="cuda") * 0.1
        t = cuda_time(lambda: moe_t.route(lg, bias, 8, True, 2.5), iters=50)
        tr = cuda_time(lambda: moe_ref.route(lg, bias, 8, True, 2.5), iters=50)
        row(log, "route", f"T={T} E=128 k=8", t, tr, "torch reference")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="mla,moe,decode,chunk")
    ap.add_argument("--heads", default="16,32,96", help="KDA chunk head counts")
    ap.add_argument("--chunk-sweep", action="store_true", help="also time kda_chunked's other launch shapes")
    ap.add_argument("--no-fla", action="store_true", help="leave flash-linear-attention out (it autotunes for minutes)")
    args = ap.parse_args()
    log = Log(os.path.join(args.out, "kernels.log") if args.out else None)
    log(f"# kernels {stamp()} on {torch.cuda.get_device_name()} torch {torch.__version__}")
    fla = None
    try:
        if not args.no_fla:
            import fla.ops.kda as fla
    except Exception as e:
        log(f"flash-linear-attention unavailable: {e}")
    heads = [int(h) for h in args.heads.split(",")]
    sections = {"gemv": lambda: bench_gemv(log), "cold": lambda: bench_cold(log), "splits": lambda: bench_mla_splits(log),
                "mla": lambda: bench_mla(log, args.quick), "moe": lambda: bench_moe(log, args.quick),
                "decode": lambda: bench_decode(log, fla, args.quick),
                "chunk": lambda: bench_chunk(log, fla, args.quick, heads, args.chunk_sweep)}
    for name in args.sections.split(","):
        fn = sections[name]
        try:
            fn()
        except Exception as e:
            log(f"section failed: {type(e).__name__}: {e}")
    log("\n| kernel | shape | ours (us) | compared with | theirs (us) | speed-up | note |")
    log("|---|---|---|---|---|---|---|")
    for name, shape, ours, oname, other, ratio, note in ROWS:
        log(f"| {name} | {shape} | {ours * 1e6:.1f} | {oname} | {other * 1e6 if other else 0:.1f} | {ratio} | {note} |")


if __name__ == "__main__":
    main()
