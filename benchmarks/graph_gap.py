"""How a captured decode step's wall time splits between the graph's kernels and the gap before it.

    PYTHONPATH=. python benchmarks/graph_gap.py [--preset k3-mini] [--batches 1,2] [--steps 50]

For the engine's decode graph (its default kernels) at each batch size, three figures in one run:
- synced: each replay timed alone with CUDA events, the host waiting for it before issuing the next (how
  `decode_ladder.py` times a stage);
- back to back: `--steps` replays issued without waiting, one event pair around all of them (the engine's steady
  state, where the host prepares step n + 1 while the device runs step n);
- host: the host time of one `run` call (copies into the static inputs and the graph launch), no waiting.
With and without programmatic dependent launch. The difference between the first two is what the device spends
between graphs, not in them.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import back_to_back, cuda_time, host_time  # noqa: E402
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402
import kestrel.ops as ops  # noqa: E402


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--batches", default="1,2")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    cfg = preset_config(args.preset)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.fuse_projections()
    print(f"| {args.preset} batch | PDL | synced (ms/step) | back to back (ms/step) | gap (us) | host run (us) |")
    print("|---|---|---|---|---|---|")
    for B in map(int, args.batches.split(",")):
        setup = DecodeSetup(cfg, B, args.ctx, args.page_size)
        fb = setup.batch_fb()
        for pdl in (True, False):
            ops.PDL = pdl
            runner = DecodeGraphRunner(model, setup.mem, batch_sizes=(B,), max_pages_per_seq=setup.page_table.shape[1])
            runner.capture()
            run = lambda: runner.run(fb)  # noqa: E731
            synced = cuda_time(run, warmup=3, iters=30)
            b2b = back_to_back(run, args.steps)
            host = host_time(run, 20) * 1e6
            print(f"| {B} | {'on' if pdl else 'off'} | {synced * 1e3:.3f} | {b2b * 1e3:.3f} | "
                  f"{(synced - b2b) * 1e6:.0f} | {host:.0f} |")
            runner = None
        ops.PDL = True
        setup = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
