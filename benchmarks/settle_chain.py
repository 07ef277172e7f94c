"""What one AttnRes settle costs on the decode chain, against a plain GEMV boundary and a one-CTA norm (issue 9).

The batch-1 decode graph's timelines charge each of the 48 settles ~4.7 us, where a GEMV boundary in a plain PDL
chain costs ~1.1 us beyond its bytes (benchmarks/persistent_chain.py), and cutting the settle's arithmetic did not
move it (docs/kernels.md, 2026-12-06 05:11). This separates the parts. A chain of L links, x_{i+1} = f(W_i x_i)
(W_i [D, D] bf16, the model's one-row GEMV, kestrel.ops.linear.triton.linear), with f one of:
- `gemv`: nothing (L GEMV boundaries, the baseline);
- `gemv + rmsnorm`: the one-CTA RMSNorm kernel, which waits first (what any one-CTA kernel costs);
- `gemv + settle, waits first`: kestrel.ops.attn_res.triton.attn_res_settle over NB bank values, the partial sum and
  the next RMSNorm, waiting before it reads anything;
- `gemv + settle`: the same as the model runs it: the GEMV triggers late, the settle reads the bank and the partial
  sum and forms their logits before its wait (`early`).

Each chain is checked against the same ops' torch references, then timed in one CUDA graph under programmatic
dependent launch, turn about. The table gives each chain's time per link and what f adds to a link.

    PYTHONPATH=. python benchmarks/settle_chain.py --dim 2048 --links 48 --banks 1,6
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/settle_chain.py --device cpu --dim 256 --links 3   # checks only
"""

import argparse
import statistics

import torch

from benchmarks.common import rel_err, replay_ms, stamp
from kestrel.ops.attn_res import reference as attn_res_ref
from kestrel.ops.norm import reference as norm_ref

EPS = 1e-6


def make_inputs(D: int, L: int, banks: int, dev: torch.device, seed: int = 0) -> dict:
    """Random weights and values; the key is scaled so that the logits are O(1) and every bank value weighs in."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16).to(dev)  # noqa: E731
    return dict(w=r(L, D, D, scale=D ** -0.5), x=r(1, D), bank=[r(1, D) for _ in range(banks)], partial=r(1, D),
                key_norm=1 + r(D, scale=0.1), key_proj=r(D, scale=D ** -0.5), norm_weight=1 + r(D, scale=0.1))


def chain(kind: str, inp: dict, ops) -> list[torch.Tensor]:
    """The chain's outputs x_1 .. x_L with `ops` = (gemv(x, w, late_trigger), rms_norm(x, w, eps),
    settle(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, early) -> (new partial, normed))."""
    gemv, rms_norm, settle = ops
    x, out = inp["x"], []
    early = kind == "gemv + settle"
    for w in inp["w"]:
        y = gemv(x, w, early)
        if kind == "gemv + rmsnorm":
            y = rms_norm(y, inp["norm_weight"], EPS)
        elif kind.startswith("gemv + settle"):
            y = settle(inp["bank"], inp["partial"], y, inp["key_norm"], inp["key_proj"], EPS, inp["norm_weight"], EPS,
                       early)[1]
        out.append(y)
        x = y
    return out


def kernel_ops():
    from kestrel.ops.attn_res.triton import attn_res_settle
    from kestrel.ops.linear.triton import linear
    from kestrel.ops.norm.triton import rms_norm

    return (lambda x, w, late: linear(x, w, late_trigger=late), rms_norm, attn_res_settle)


def reference_ops():
    def settle(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps, early):
        return attn_res_ref.attn_res_settle(bank, partial, delta, key_norm, key_proj, eps, norm_weight, norm_eps)

    return (lambda x, w, late: (x.float() @ w.float().T).to(x.dtype), norm_ref.rms_norm, settle)


KINDS = ("gemv", "gemv + rmsnorm", "gemv + settle, waits first", "gemv + settle")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=2048, help="D: k3-mini's hidden size")
    ap.add_argument("--links", type=int, default=48, help="links in the chain (the step has 48 settles)")
    ap.add_argument("--banks", default="1,6", help="bank values before the partial sum (k3-mini: 1 to 6)")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="turn-about rounds (medians reported)")
    ap.add_argument("--device", default="cuda", help="cpu: only the checks (under TRITON_INTERPRET=1)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        from benchmarks.common import pdl_device

        dev, sms, bw = pdl_device()
        print(f"{stamp()} {torch.cuda.get_device_name(dev)}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s, "
              f"{args.links} links of D = {args.dim}")
    fast = kernel_ops()
    sides = {}
    banks = [int(b) for b in args.banks.split(",")]
    for nb in banks:
        inp = make_inputs(args.dim, args.links, nb, dev)
        for kind in KINDS:
            settle = kind.startswith("gemv + settle")
            if settle or nb == banks[0]:  # (the chains without a settle once)
                name = f"{kind} ({nb} bank values)" if settle else kind
                got = chain(kind, inp, fast)
                want = chain(kind, inp, reference_ops())
                err = max(rel_err(a, b) for a, b in zip(got, want))
                assert err < 5e-2, f"{name}: relative error {err:.3g} against the torch ops"
                print(f"{name}: checked, largest rel err of a link {err:.1e}")
                sides[name] = (kind, inp, err)
    if dev.type != "cuda":
        return
    graphs = {}
    for name, (kind, inp, err) in sides.items():
        g = torch.cuda.CUDAGraph()
        chain(kind, inp, fast)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            chain(kind, inp, fast)
        graphs[name] = g
    times = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, g in graphs.items():
            times[name].append(replay_ms(g, args.replays))
    L = args.links
    floor_us = args.dim * args.dim * 2 / bw * 1e6
    base = statistics.median(times["gemv"]) * 1e3 / L
    print(f"\nfloor of one {args.dim} x {args.dim} bf16 GEMV: {floor_us:.2f} us")
    print("| chain | us a link | beyond the GEMV floor | added to a link vs gemv | rounds (ms) |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        per = statistics.median(ts) * 1e3 / L
        print(f"| {name} | {per:.2f} | {per - floor_us:.2f} | {per - base:+.2f} | "
              f"{', '.join(f'{t:.3f}' for t in ts)} |")


if __name__ == "__main__":
    main()
