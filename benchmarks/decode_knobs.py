"""The engine's decode graph under different module settings ("knobs") of the kernels and the model, timed turn about.

    PYTHONPATH=. python benchmarks/decode_knobs.py --knob kestrel.ops.moe.SHARED_STREAM=True,False [--knob ...] \
        [--preset k3-mini] [--batches 1,2,4,8] [--prefill-lens 512,4096]

For each batch size the decode graph (`DecodeGraphRunner`, as the engine captures it; programmatic dependent launch
on unless --disable-pdl) is captured once per value of the knob, from the same random caches, and the graphs are
timed turn about, back to back (the engine's overlapped steady state). Each variant's logits are compared with the
first's: bit-equal, or their relative error (a different reduction order moves a random 24-layer bf16 model's
logits far, so that is a rounding report). --prefill-lens also times one eager full-sequence forward per length
under each value, turn about. --verify-block N times a speculative step's target side instead (or too, without
--skip-decode): the verify graph over blocks of N tokens and its fold. `compare` is the loop other benchmarks reuse
with their own variants.
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import back_to_back, parse_knob  # noqa: E402
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402
import kestrel.ops as ops  # noqa: E402


def _set(settings: dict) -> dict:
    """Apply {(module, name): value}; returns the values they replaced."""
    old = {}
    for (mod, name), value in settings.items():
        old[(mod, name)] = getattr(mod, name)
        setattr(mod, name, value)
    return old


def _turn_about(setup, variants, build, step, key, prefix: str, rounds: int, steps: int, log) -> list[tuple]:
    """Each variant's runner built under its settings (`build()`), its logits from one `step(runner)` on the
    setup's caches as they were, then `step` timed back to back, turn about. Rows as compare's, `key` first."""
    states = list(setup.st.ssm.values()) + list(setup.st.conv.values())
    snap = [t.clone() for t in states]
    runners, logits = {}, {}
    for label, settings in variants:
        old = _set(settings)
        try:
            r = runners[label] = build()
            for t, s in zip(states, snap):
                t.copy_(s)
            logits[label] = step(r).logits.float().clone()
        finally:
            _set(old)
    times = {label: [] for label in runners}
    for _ in range(rounds):
        for label, r in runners.items():
            times[label].append(back_to_back(lambda: step(r), steps, rounds=1))
    base = variants[0][0]
    rows = []
    for label in runners:
        t, t0 = statistics.median(times[label]), statistics.median(times[base])
        same = torch.equal(logits[label], logits[base])
        err = ((logits[label] - logits[base]).norm() / logits[base].norm()).item()
        rows.append((key, label, t, t0 / t, err, same))
        log(f"{prefix} {label}: {t * 1e3:.3f} ms/step ({min(times[label]) * 1e3:.3f}-"
            f"{max(times[label]) * 1e3:.3f}), {t0 / t:.3f}x {base}; logits "
            f"{'bit-equal' if same else f'rel err {err:.2e}'}", flush=True)
    runners.clear()
    torch.cuda.empty_cache()
    return rows


@torch.no_grad()
def compare(model, cfg, batch: int, variants: list[tuple[str, dict]], ctx: int = 1024, page_size: int = 64,
            rounds: int = 6, steps: int = 20, log=print) -> list[tuple]:
    """variants: (label, {(module, name): value}); the first is the baseline. Returns one row per variant:
    (batch, label, seconds a step (median of rounds), baseline / it, logits rel err vs the baseline, bit-equal)."""
    setup = DecodeSetup(cfg, batch, ctx, page_size)
    fb = setup.batch_fb()

    def build():
        r = DecodeGraphRunner(model, setup.mem, batch_sizes=(batch,), max_pages_per_seq=setup.page_table.shape[1])
        r.capture()
        return r

    return _turn_about(setup, variants, build, lambda r: r.run(fb), batch, f"batch {batch}", rounds, steps, log)


@torch.no_grad()
def compare_verify(model, cfg, batch: int, variants: list[tuple[str, dict]], block: int, ctx: int = 1024,
                   page_size: int = 64, rounds: int = 6, steps: int = 20, log=print) -> list[tuple]:
    """The same variants on a speculative step's target side at `batch` blocks of `block` tokens: the verify graph
    (`VerifyGraphRunner`, as the engine captures it) and its fold graph committing a random prefix of each block,
    replayed together, back to back, turn about. Logits compared with the first variant's; rows as compare's."""
    from kestrel.engine.cuda_graph import VerifyGraphRunner
    from kestrel.models.forward_batch import ForwardBatch, ForwardMode

    setup = DecodeSetup(cfg, batch, ctx + block, page_size)
    ps, table_rows = setup.ps, setup.page_table.tolist()
    pos = [ctx + i for i in range(block)]
    locs = [row[p // ps] * ps + p % ps for row in table_rows for p in pos]
    T = batch * block
    fb = ForwardBatch(ForwardMode.VERIFY, torch.randint(3, cfg.vocab_size, (T,), device="cuda"),
                      torch.tensor(pos * batch, device="cuda"), [block] * batch, [ctx] * batch, mem=setup.mem,
                      page_table=setup.page_table, out_cache_loc=torch.tensor(locs, device="cuda"),
                      state_slots=setup.slots,
                      verify_lens_t=torch.full((batch,), block, dtype=torch.int32, device="cuda"),
                      key_lens_t=torch.tensor([ctx + 1 + i for i in range(block)] * batch, dtype=torch.int32,
                                              device="cuda"))
    commit = torch.randint(1, block + 1, (batch,), dtype=torch.int32, device="cuda")

    def build():
        r = VerifyGraphRunner(model, setup.mem, (batch,), block, setup.page_table.shape[1], ())
        r.ensure_fold(batch, block)
        return r

    def step(r):
        out = r.run(fb)
        r.fold(commit)
        return out

    name = f"verify {batch}x{block} + fold"
    return _turn_about(setup, variants, build, step, name, name, rounds, steps, log)


@torch.no_grad()
def compare_prefill(model, cfg, length: int, variants: list[tuple[str, dict]], rounds: int = 6,
                    log=print) -> list[tuple]:
    """The same variants on one eager full-sequence forward of `length` random tokens (the stateless prefill
    path, `reference_logits`, last position only), timed turn about; rows as compare's, with batch = -length."""
    toks = torch.randint(3, cfg.vocab_size, (length,)).tolist()
    times, logits = {label: [] for label, _ in variants}, {}
    for r in range(rounds + 1):
        for label, settings in variants:
            old = _set(settings)
            try:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = model.reference_logits(toks, last_only=True)
                b.record()
                b.synchronize()
            finally:
                _set(old)
            if r:  # the first round compiles and warms up
                times[label].append(a.elapsed_time(b) / 1e3)
            logits[label] = out.float()
    base = variants[0][0]
    rows = []
    for label, _ in variants:
        t, t0 = statistics.median(times[label]), statistics.median(times[base])
        same = torch.equal(logits[label], logits[base])
        err = ((logits[label] - logits[base]).norm() / logits[base].norm()).item()
        rows.append((-length, label, t, t0 / t, err, same))
        log(f"prefill {length} {label}: {t * 1e3:.3f} ms, {t0 / t:.3f}x {base}; logits "
            f"{'bit-equal' if same else f'rel err {err:.2e}'}", flush=True)
    return rows


def table(rows, preset: str, baseline: str) -> str:
    out = [f"| {preset} batch | variant | ms/step | tok/s | vs {baseline} | logits vs {baseline} |", "|---|---|---|---|---|---|"]
    for B, label, t, x, err, same in rows:
        if isinstance(B, str):  # a verify step: tok/s counts its blocks (steps a second x batch)
            tokens = int(B.split()[1].split("x")[0])
        else:
            B, tokens = (f"prefill of {-B} tokens", -B) if B < 0 else (B, B)
        out.append(f"| {B} | {label} | {t * 1e3:.3f} | {tokens / t:.0f} | {x:.3f}x | {'bit-equal' if same else f'{err:.1e}'} |")
    return "\n".join(out)


def common_args(ap: argparse.ArgumentParser, batches: str) -> None:
    """The options every decode-graph comparison takes (this script's and gemv_rows.py's)."""
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--batches", default=batches)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--disable-pdl", action="store_true", help="plain launches (the engine's --disable-pdl)")


def fused_model(args):
    """(config, random bf16 model with fused projections) for args.preset, PDL set as the engine sets it."""
    ops.PDL = not args.disable_pdl
    cfg = preset_config(args.preset)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.fuse_projections()
    return cfg, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--knob", required=True, action="append",
                    help="module.NAME=value,value,... (Python literals; the first: baseline); repeat it for more "
                         "knobs, each timed turn about on its own against its first value")
    ap.add_argument("--prefill-lens", default="", help="also one eager full-sequence forward of each length")
    ap.add_argument("--verify-block", type=int, default=0,
                    help="also a speculative verify (blocks of this many tokens) + fold graph at each batch size")
    ap.add_argument("--skip-decode", action="store_true", help="no decode graphs (with --verify-block)")
    common_args(ap, "1,2,4,8")
    args = ap.parse_args()
    cfg, model = fused_model(args)
    print(f"PDL {'off' if args.disable_pdl else 'on'}")
    for spec in args.knob:  # each knob its own turn about, on the same model
        mod, name, values = parse_knob(spec)
        variants = [(f"{name}={v!r}", {(mod, name): v}) for v in values]
        rows = []
        for B in map(int, args.batches.split(",")):
            if not args.skip_decode:
                rows += compare(model, cfg, B, variants, args.ctx, args.page_size, args.rounds, args.steps)
            if args.verify_block:
                rows += compare_verify(model, cfg, B, variants, args.verify_block, args.ctx, args.page_size,
                                       args.rounds, args.steps)
        for n in filter(None, args.prefill_lens.split(",")):
            rows += compare_prefill(model, cfg, int(n), variants, args.rounds)
        print()
        print(table(rows, args.preset, variants[0][0]), flush=True)


if __name__ == "__main__":
    main()
