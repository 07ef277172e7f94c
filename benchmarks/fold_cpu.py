"""ReplaySSM's CPU fold: one fold per KDA layer against one fold over the layers stacked (kda_fold_layers), on
the bundled k3-small's shapes, the two sides taking turns; checks they leave the same bits.

    OMP_NUM_THREADS=1 python benchmarks/fold_cpu.py [--batch 1] [--layers 6] [--rounds 7]

A batch-1 speculative step folds every KDA layer once after its verify; at k3-small's sizes each layer's fold is a
few dozen small torch ops, so the time is per-op overhead rather than arithmetic.
"""

import argparse
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.models.presets import preset_config  # noqa: E402
from kestrel.ops.kda import reference as ref  # noqa: E402


def records(cfg, B: int, L: int, n: int, gen: torch.Generator):
    H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    C = cfg.conv_dim
    slots = torch.arange(1, B + 1)
    convs = [torch.randn(B + 1, W - 1, C, generator=gen) for _ in range(n)]
    ssms = [torch.randn(B + 1, H, K, K, generator=gen) for _ in range(n)]
    recs = []
    for layer in range(n):
        x = torch.randn(B, L, C, generator=gen)
        raw, beta = torch.randn(B, L, H, K, generator=gen), torch.randn(B, L, H, generator=gen)
        w = torch.randn(C, W, generator=gen)
        A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * K, generator=gen)
        recs.append(ref.kda_verify(x, raw, beta, [L] * B, w, convs[layer], ssms[layer], slots, A_log, dt_bias,
                                   cfg.gate_lower_bound, K**-0.5, beta_logits=True)[1])
    return recs, convs, ssms, slots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="default: the preset's KDA layer count")
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200, help="folds timed per round and side")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = preset_config("k3-small")
    n = args.layers or len(cfg.kda_layer_ids)
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    recs, convs, ssms, slots = records(cfg, args.batch, args.gamma + 1, n, gen)
    commits = [[rng.randint(1, args.gamma + 1) for _ in range(args.batch)] for _ in range(args.calls)]

    def per_layer(c):
        for rec, conv, ssm in zip(recs, convs, ssms):
            ref.kda_fold(rec, conv, ssm, slots, c)

    def stacked(c):
        ref.kda_fold_layers(recs, convs, ssms, slots, c)

    # same bits: both sides from the same states
    saved = [t.clone() for t in convs + ssms]
    per_layer(commits[0])
    want = [t.clone() for t in convs + ssms]
    for t, s in zip(convs + ssms, saved):
        t.copy_(s)
    stacked(commits[0])
    same = all(torch.equal(a, b) for a, b in zip(convs + ssms, want))
    times = {"per layer": [], "stacked": []}
    for _ in range(args.rounds):
        for name, fn in (("per layer", per_layer), ("stacked", stacked)):
            for t, s in zip(convs + ssms, saved):  # states stay finite whatever was folded before
                t.copy_(s)
            start = time.perf_counter()
            for c in commits:
                fn(c)
            times[name].append((time.perf_counter() - start) / len(commits) * 1e3)
    a, b = (statistics.median(times[k]) for k in ("per layer", "stacked"))
    L = args.gamma + 1
    print(f"k3-small shapes, {n} KDA layers, batch {args.batch}, blocks of {L}, commits 1..{L}")
    print(f"fold per layer {a:.3f} ms, stacked {b:.3f} ms a step (medians of {args.rounds} rounds): x{a / b:.2f}; "
          f"bit-equal: {same}")
    print("rounds: " + "; ".join(f"{k} " + ", ".join(f"{t:.3f}" for t in v) for k, v in times.items()))


if __name__ == "__main__":
    main()
