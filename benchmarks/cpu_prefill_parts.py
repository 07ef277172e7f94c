"""The CPU prefill's KDA parts, this tree against a baseline, turn about: the chunked recurrence (`kda_chunked`) and
the packed short conv (`PackedConvWindows`) at k3-small's shapes, for a batch of many short prompts and for one long
one. Both sides' outputs are compared (the conv bit for bit; the recurrence to rounding, which the hoisted form
changes).

    OMP_NUM_THREADS=1 python benchmarks/cpu_prefill_parts.py [--baseline REV] [--rounds 10] [--engine 3]

The baseline is kestrel/ops/kda/reference.py as of git revision REV (default HEAD), loaded beside this tree's; with
--baseline none it is this tree with its CPU cache blocking off (CPU_GROUP_BYTES, CPU_BLOCK_BYTES unbounded). Each
row is the median of --rounds calls per side, the sides taking turns (this machine's speed moves by tens of per cent
between minutes). --engine N also times whole engine prefills (the bundled k3-small, overlap off; 64 prompts of 64
tokens, then one of 1024) with the two parts swapped for the baseline's, N rounds each side, turn about: the wall
time of each prefill and the part of it spent in kda_chunked.
"""

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.models.presets import preset_config  # noqa: E402
from kestrel.ops.kda import reference as ours  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_baseline(rev: str):
    """kestrel/ops/kda/reference.py at `rev` as a module of its own (its imports resolve to this tree)."""
    src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:kestrel/ops/kda/reference.py"], check=True,
                         capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("kda_reference_baseline", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod


class Unblocked:
    """This tree's module with its CPU cache blocking switched off for the duration of each call."""

    def __getattr__(self, name):
        fn = getattr(ours, name)

        def call(*a, **kw):
            saved = ours.CPU_GROUP_BYTES, ours.CPU_BLOCK_BYTES
            ours.CPU_GROUP_BYTES = ours.CPU_BLOCK_BYTES = 1 << 62
            try:
                return fn(*a, **kw)
            finally:
                ours.CPU_GROUP_BYTES, ours.CPU_BLOCK_BYTES = saved
        return call


def cases(cfg, gen):
    H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    C = 3 * H * K
    for n, L in ((64, 64), (1, 1024), (8, 300)):
        T = n * L
        cu = list(range(0, T + 1, L))
        q = ours.l2norm(torch.randn(T, H, K, generator=gen))
        k = ours.l2norm(torch.randn(T, H, K, generator=gen))
        v = torch.randn(T, H, K, generator=gen)
        g = -torch.rand(T, H, K, generator=gen) * 0.5
        beta = torch.rand(T, H, generator=gen)
        x, w = torch.randn(T, C, generator=gen), torch.randn(C, W, generator=gen)
        tails = torch.randn(n, W - 1, C, generator=gen)
        yield (f"kda_chunked {n} x {L}", lambda m: m.kda_chunked(q, k, v, g, beta, cu_seqlens=cu)[0])
        yield (f"packed conv {n} x {L}", lambda m: m.PackedConvWindows(x, cu, w, tails).y)


def engine_prefills(base, rounds: int) -> None:
    from kestrel.config import ServerArgs
    from kestrel.engine.core import EngineCore
    import kestrel.ops.kda as kda_ops

    core = EngineCore(ServerArgs(model_path="k3-small", dtype="float32", device="cpu", disable_radix_cache=True,
                                 disable_overlap_schedule=True, chunked_prefill_size=4096, max_running_requests=64))
    vocab = core.model.cfg.vocab_size
    gen = torch.Generator().manual_seed(1)
    spent = [0.0]
    sides = {"base": (base.kda_chunked, base.PackedConvWindows), "ours": (ours.kda_chunked, ours.PackedConvWindows)}

    def wave(side, n, length):
        chunked, conv = sides[side]

        def timed(*a, **kw):
            t = time.perf_counter()
            out = chunked(*a, **kw)
            spent[0] += time.perf_counter() - t
            return out
        ours_chunked, ours_conv = ours.kda_chunked, kda_ops.PackedConvWindows
        ours.kda_chunked, kda_ops.PackedConvWindows = timed, conv
        try:
            for _ in range(n):
                prompt = torch.randint(3, vocab, (length,), generator=gen).tolist()
                core.add_request(core.make_request(prompt, {"max_new_tokens": 1, "temperature": 0}))
            spent[0] = 0.0
            t = time.perf_counter()
            while core.has_work():
                core.step()
            return time.perf_counter() - t, spent[0]
        finally:
            ours.kda_chunked, kda_ops.PackedConvWindows = ours_chunked, ours_conv

    for side in sides:
        wave(side, 4, 64)  # warm-up
    print("\n| engine prefill (k3-small, fp32) | baseline: wall / kda_chunked (ms) | this tree | wall ratio |")
    print("|---|---|---|---|")
    for n, length in ((64, 64), (1, 1024)):
        res = {"base": [], "ours": []}
        for _ in range(rounds):
            for side in res:
                res[side].append(wave(side, n, length))
        (wb, kb), (wo, ko) = [[statistics.median(r[i] for r in res[s]) * 1e3 for i in (0, 1)] for s in ("base", "ours")]
        print(f"| {n} x {length} tokens | {wb:.0f} / {kb:.0f} | {wo:.0f} / {ko:.0f} | {wb / wo:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="HEAD", help="a git revision, or 'none' (this tree, cache blocking off)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--engine", type=int, default=0, help="rounds of whole engine prefills a side (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    base = Unblocked() if args.baseline == "none" else load_baseline(args.baseline)
    cfg = preset_config("k3-small")
    print(f"| part (k3-small shapes, fp32) | baseline {args.baseline} (ms) | this tree (ms) | ratio | outputs |")
    print("|---|---|---|---|---|")
    for name, fn in cases(cfg, torch.Generator().manual_seed(0)):
        a, b = fn(base), fn(ours)
        same = "bit-equal" if torch.equal(a, b) else f"max abs diff {(a - b).abs().max().item():.1e}"
        times = {"base": [], "ours": []}
        for _ in range(args.rounds):
            for side, mod in (("base", base), ("ours", ours)):
                t = time.perf_counter()
                fn(mod)
                times[side].append(time.perf_counter() - t)
        tb, to = (statistics.median(times[s]) * 1e3 for s in ("base", "ours"))
        print(f"| {name} | {tb:.1f} | {to:.1f} | {tb / to:.2f}x | {same} |", flush=True)
    if args.engine:
        engine_prefills(base, args.engine)


if __name__ == "__main__":
    main()
