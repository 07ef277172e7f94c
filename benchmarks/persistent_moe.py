"""The latent MoE block of one decode token as one persistent kernel, against the model's five PDL launches
(docs/kernels.md, "Targets: met and missed", next steps 1 and 2).

The kernel and its design: kestrel.ops.moe.persistent (the model runs it with kestrel.ops.moe.PERSISTENT_BLOCK on).
A chain of `--layers` k3-mini MoE blocks with random weights, each block's output the next one's input, captured in
one CUDA graph under PDL: the model's blocks (five launches each) against the persistent kernel in each of the
`--configs`, turn about. Each persistent block is checked against the model's block on the same input first; a
config whose programs cannot all be resident at once is skipped (its first barrier would wait forever).

    PYTHONPATH=. python benchmarks/persistent_moe.py --layers 23 --configs 1x:16,1x:16:l2
"""
import argparse
import statistics

import torch

from kestrel.ops.moe.persistent import PersistentMoE


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


def block_of(moe, programs: int) -> PersistentMoE:
    """A PersistentMoE of `programs` programs over a fused kestrel.models.moe.MoE's weights (no copies)."""
    e, se = moe.experts, moe.shared_experts
    return PersistentMoE(moe.gate.weight, moe.gate.routing(), moe._fused.weight, e.w1.data, e.w3.data, e.w2.data,
                         moe.routed_expert_norm.weight, moe.routed_expert_norm.eps, moe.routed_expert_up_proj.weight,
                         se.down_proj.weight, moe.act, programs)



def main():
    from benchmarks.common import pdl_device, rel_err, replay_ms, stamp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--layers", type=int, default=23, help="MoE blocks in the chain (k3-mini has 23)")
    ap.add_argument("--configs", default="1x:16,1x:16:l2,1x:32:l2,2x:8:l2",
                    help="persistent kernels to time, comma-separated PROGRAMS:WARPS[:l2]; PROGRAMS as a count or as "
                         "a multiple of the SMs (2x); l2: the tail and down tiles asked into L2 early")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="turn-about rounds (medians reported)")
    args = ap.parse_args()
    dev, sms, bw = pdl_device()
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
        ps = [block_of(m, G) for m in blocks]
        name = f"persistent, {G} programs x {w} warps{', L2 prefetch' if l2 else ''}"
        resident = ps[0].resident(x0, w, l2=l2)
        print(f"{name}: {ps[0].occupancy}")
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
