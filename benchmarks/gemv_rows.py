"""Small-batch decode: cuBLAS against the Triton GEMV for the large weights' products at 2-8 rows.

    PYTHONPATH=. python benchmarks/gemv_rows.py [--preset k3-mini] [--batches 2,4,8] [--rows 1,2,4,8]

At one row every linear layer of the decode step runs in the Triton GEMV (weights streamed before the PDL wait,
norms and activations fused in as prologues); above `kestrel.ops.linear.GEMV_MAX_M` rows a large weight's product
goes to cuBLAS, with its norms and activations as kernels of their own. For each batch size, the engine's decode
graph captured with each GEMV_MAX_M in --rows (programmatic dependent launch on, as the engine runs it, unless
--disable-pdl), timed turn about (back to back replays, the engine's steady state),
and each variant's logits against the cuBLAS one's (the same model and caches; different reduction orders).
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import back_to_back  # noqa: E402
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402
import kestrel.ops as ops  # noqa: E402
from kestrel.ops import linear as linear_ops  # noqa: E402
from kestrel.ops.linear import triton as linear_triton  # noqa: E402
from kestrel.ops.moe import triton as moe_triton  # noqa: E402


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--batches", default="2,4,8")
    ap.add_argument("--rows", default="1,2,4,8",
                    help="GEMV_MAX_M values (1: the large weights on cuBLAS; first: the baseline); a trailing g also sets "
                         "linear.triton.ROW_GRID_LARGE_MAX_M (each row in its own programs), a trailing r "
                         "moe.triton.ROUTE_IN_KERNEL_MAX_TOKENS = 8 (the expert GEMVs route every token themselves)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--disable-pdl", action="store_true", help="plain launches (the engine's --disable-pdl)")
    args = ap.parse_args()
    ops.PDL = not args.disable_pdl  # as the engine sets it
    cfg = preset_config(args.preset)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.fuse_projections()
    default, default_grid = linear_ops.GEMV_MAX_M, linear_triton.ROW_GRID_LARGE_MAX_M
    default_route = moe_triton.ROUTE_IN_KERNEL_MAX_TOKENS
    table = []
    for B in map(int, args.batches.split(",")):
        setup = DecodeSetup(cfg, B, args.ctx, args.page_size)
        fb = setup.batch_fb()
        states = list(setup.st.ssm.values()) + list(setup.st.conv.values())
        snap = [t.clone() for t in states]
        runners, logits = {}, {}
        for key in args.rows.split(","):
            m, grid, route = int(key.rstrip("gr")), "g" in key, "r" in key
            if m > 1 and m < B:
                continue  # the same graph as cuBLAS
            linear_ops.GEMV_MAX_M = m
            linear_triton.ROW_GRID_LARGE_MAX_M = m if grid else 0
            moe_triton.ROUTE_IN_KERNEL_MAX_TOKENS = 8 if route else 1
            r = runners[key] = DecodeGraphRunner(model, setup.mem, batch_sizes=(B,),
                                                 max_pages_per_seq=setup.page_table.shape[1])
            r.capture()
            for t, s in zip(states, snap):
                t.copy_(s)
            logits[key] = r.run(fb).logits.float().clone()
        linear_ops.GEMV_MAX_M, linear_triton.ROW_GRID_LARGE_MAX_M = default, default_grid
        moe_triton.ROUTE_IN_KERNEL_MAX_TOKENS = default_route
        times = {m: [] for m in runners}
        for _ in range(args.rounds):
            for m, r in runners.items():
                times[m].append(back_to_back(lambda: r.run(fb), args.steps, rounds=1))
        base = next(iter(runners))
        for m in runners:
            t = statistics.median(times[m])
            err = ((logits[m] - logits[base]).norm() / logits[base].norm()).item()
            same = torch.equal(logits[m].argmax(-1), logits[base].argmax(-1))
            table.append((B, m, t, statistics.median(times[base]) / t, err, same))
            print(f"batch {B} GEMV_MAX_M {m}: {t * 1e3:.3f} ms/step ({min(times[m]) * 1e3:.3f}-{max(times[m]) * 1e3:.3f}), "
                  f"{statistics.median(times[base]) / t:.3f}x GEMV_MAX_M {base}; logits rel err {err:.2e}, "
                  f"argmax equal {same}", flush=True)
        runners = setup = None
        torch.cuda.empty_cache()
    print(f"\nPDL {'off' if args.disable_pdl else 'on'}")
    print(f"| {args.preset} batch | GEMV_MAX_M | ms/step | tok/s | vs cuBLAS | logits rel err vs cuBLAS |")
    print("|---|---|---|---|---|---|")
    for B, m, t, x, err, same in table:
        print(f"| {B} | {m} | {t * 1e3:.3f} | {B / t:.0f} | {x:.3f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
