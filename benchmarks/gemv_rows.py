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
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.decode_knobs import common_args, compare, fused_model, table  # noqa: E402
from kestrel.ops import linear as linear_ops  # noqa: E402
from kestrel.ops.linear import triton as linear_triton  # noqa: E402
from kestrel.ops.moe import triton as moe_triton  # noqa: E402


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8",
                    help="GEMV_MAX_M values (1: the large weights on cuBLAS; first: the baseline); a trailing g also sets "
                         "linear.triton.ROW_GRID_LARGE_MAX_M (each row in its own programs), a trailing r "
                         "moe.triton.ROUTE_IN_KERNEL_MAX_TOKENS = 8 (the expert GEMVs route every token themselves)")
    common_args(ap, "2,4,8")
    args = ap.parse_args()
    cfg, model = fused_model(args)
    rows = []
    for B in map(int, args.batches.split(",")):
        variants = []
        for key in args.rows.split(","):
            m, grid, route = int(key.rstrip("gr")), "g" in key, "r" in key
            if m > 1 and m < B:
                continue  # the same graph as cuBLAS
            variants.append((f"GEMV_MAX_M {key}", {(linear_ops, "GEMV_MAX_M"): m,
                                                    (linear_triton, "ROW_GRID_LARGE_MAX_M"): m if grid else 0,
                                                    (moe_triton, "ROUTE_IN_KERNEL_MAX_TOKENS"): 8 if route else 1}))
        rows += compare(model, cfg, B, variants, args.ctx, args.page_size, args.rounds, args.steps)
    print(f"\nPDL {'off' if args.disable_pdl else 'on'}")
    print(table(rows, args.preset, "the first variant"))

if __name__ == "__main__":
    main()
