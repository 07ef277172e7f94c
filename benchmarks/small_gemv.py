"""Small linear layers of 2-8 rows on the GEMV (under PDL, with prologues) against cuBLAS: CUDA-graph decode steps at
batches 1-8 and a batch-1 verify step of 8 tokens, the two routings captured side by side and timed turn about.

  PYTHONPATH=. python benchmarks/small_gemv.py [--presets k3-small,k3-mini] [--batches 1,2,4,8]

"small" is `kestrel.ops.linear.SMALL_WEIGHT` (at most 1M weight elements): there the GEMV serves up to
SMALL_GEMV_MAX_M rows; the "cuBLAS" side sets SMALL_GEMV_MAX_M to GEMV_MAX_M (one row), as before that rule.
Random bf16 weights, ctx 1024, page size 64 (the decode ladder's set-up).
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import Log, cuda_time, stamp  # noqa: E402
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
import kestrel.ops as ops  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner, VerifyGraphRunner  # noqa: E402
from kestrel.models.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402
from kestrel.ops import linear as linear_ops  # noqa: E402


def verify_batch(cfg, setup, block: int) -> ForwardBatch:
    ps, ctx = setup.ps, setup.ctx
    row = setup.page_table[0].tolist()
    locs = [row[(ctx + i) // ps] * ps + (ctx + i) % ps for i in range(block)]
    return ForwardBatch(ForwardMode.VERIFY, torch.randint(3, cfg.vocab_size, (block,), device="cuda"),
                        torch.arange(ctx, ctx + block, device="cuda"), [block], [ctx], mem=setup.mem,
                        page_table=setup.page_table[:1], out_cache_loc=torch.tensor(locs, device="cuda"),
                        state_slots=setup.slots[:1],
                        verify_lens_t=torch.tensor([block], dtype=torch.int32, device="cuda"),
                        key_lens_t=torch.arange(ctx + 1, ctx + block + 1, dtype=torch.int32, device="cuda"))


def both(make):
    """make() captured with the small-weight rule (GEMV) and without it (cuBLAS)."""
    small = linear_ops.SMALL_GEMV_MAX_M
    out = {}
    for name, rows in (("gemv", small), ("cublas", linear_ops.GEMV_MAX_M)):
        linear_ops.SMALL_GEMV_MAX_M = rows
        out[name] = make()
    linear_ops.SMALL_GEMV_MAX_M = small
    return out


def turn_about(runs: dict, rounds: int = 6, iters: int = 20) -> dict:
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            times[k].append(cuda_time(fn, warmup=2, iters=iters))
    return {k: statistics.median(v) for k, v in times.items()}


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="k3-small,k3-mini")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log = Log(os.path.join(args.out, "small_gemv.log") if args.out else None)
    log(f"# small GEMV {stamp()} on {torch.cuda.get_device_name()}")
    ops.PDL = True
    rows = []
    for preset in args.presets.split(","):
        cfg = preset_config(preset)
        model = build_model(cfg)
        for B in [int(b) for b in args.batches.split(",")]:
            setup = DecodeSetup(cfg, B, args.ctx, 64)
            fb = setup.batch_fb()

            def decode():
                r = DecodeGraphRunner(model, setup.mem, batch_sizes=(B,), max_pages_per_seq=setup.page_table.shape[1])
                r.capture()
                return r

            runners = both(decode)
            t = turn_about({k: (lambda r=r: r.run(fb)) for k, r in runners.items()})
            rows.append((preset, f"decode, batch {B}", t["gemv"], t["cublas"]))
            log(f"{preset} decode batch {B}: gemv {t['gemv'] * 1e3:.3f} ms, cuBLAS {t['cublas'] * 1e3:.3f} ms")
            if B == 1:
                vfb = verify_batch(cfg, setup, args.block)

                def verify():
                    r = VerifyGraphRunner(model, setup.mem, (1,), args.block, setup.page_table.shape[1], ())
                    r.ensure(1, args.block)
                    return r

                runners = both(verify)
                t = turn_about({k: (lambda r=r: r.run(vfb)) for k, r in runners.items()})
                rows.append((preset, f"verify, batch 1, {args.block} tokens", t["gemv"], t["cublas"]))
                log(f"{preset} verify {args.block}: gemv {t['gemv'] * 1e3:.3f} ms, cuBLAS {t['cublas'] * 1e3:.3f} ms")
            runners = setup = None
        model = None
        torch.cuda.empty_cache()
    log("\n| model | step (CUDA graph) | small linears on the GEMV (ms) | on cuBLAS (ms) | speed-up |")
    log("|---|---|---|---|---|")
    for preset, what, g, c in rows:
        log(f"| {preset} | {what} | {g * 1e3:.3f} | {c * 1e3:.3f} | {c / g:.2f}x |")


if __name__ == "__main__":
    main()
