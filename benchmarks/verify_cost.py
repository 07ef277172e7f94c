"""What a batch-1 speculative verify of L tokens costs against one decode step, kernel by kernel (CUDA graphs, PDL
as the engine captures them; random bf16 weights of a preset).

    PYTHONPATH=. python benchmarks/verify_cost.py [--preset k3-small] [--blocks 2,4,8] [--ctx 256] [--top 40]

DSpark's batch-1 speed-up is (tokens a step) / (a step's cost in plain decode steps): on a launch-bound target the
verify's cost over the decode's is most of that divisor. Prints each graph's time two ways: one call at a time
with its host work (CUDA events, median: the runner copies its inputs, then replays), and the captured graph
replayed back to back (the device's time for the step, which is what an overlapped engine pays). For the decode
step and the longest block, the graph timeline too (each kernel charged with how far it moved the step's end:
`decode_ladder.graph_timeline`; the first kernel of a step is also charged the host's gap before it). With
--shared-stream-off, the verify graphs again with the MoE's shared experts in line (`moe.SHARED_STREAM`).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import Log, back_to_back, cuda_time, stamp  # noqa: E402
from benchmarks.common import graph_timeline  # noqa: E402
from benchmarks.decode_ladder import DecodeSetup, build_model  # noqa: E402
import kestrel.ops as ops  # noqa: E402
from kestrel.ops import moe as moe_ops  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner, VerifyGraphRunner  # noqa: E402
from kestrel.models.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402


def verify_batch(setup: DecodeSetup, block: int) -> ForwardBatch:
    """One block of `block` tokens after the sequence's ctx cached tokens (batch 1)."""
    ps, ctx = setup.ps, setup.ctx
    row = setup.page_table[0].tolist()
    locs = [row[(ctx + i) // ps] * ps + (ctx + i) % ps for i in range(block)]
    return ForwardBatch(ForwardMode.VERIFY, torch.randint(3, setup.cfg.vocab_size, (block,), device="cuda"),
                        torch.arange(ctx, ctx + block, device="cuda"), [block], [ctx], mem=setup.mem,
                        page_table=setup.page_table[:1], out_cache_loc=torch.tensor(locs, device="cuda"),
                        state_slots=setup.slots[:1],
                        verify_lens_t=torch.tensor([block], dtype=torch.int32, device="cuda"),
                        key_lens_t=torch.arange(ctx + 1, ctx + block + 1, dtype=torch.int32, device="cuda"))


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="k3-small")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--blocks", default="2,4,8")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--shared-stream-off", action="store_true", help="also the verify graphs with the shared experts "
                    "in line")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log = Log(os.path.join(args.out, "verify_cost.log") if args.out else None)
    log(f"# verify cost {stamp()} on {torch.cuda.get_device_name()}, {args.preset}, ctx {args.ctx}")
    ops.PDL = True  # as the engine captures its graphs
    torch.manual_seed(0)
    cfg = preset_config(args.preset)
    model = build_model(cfg)
    model.fuse_projections()
    setup = DecodeSetup(cfg, 1, args.ctx, args.page_size)
    fb = setup.batch_fb()
    decode = DecodeGraphRunner(model, setup.mem, batch_sizes=(1,), max_pages_per_seq=setup.page_table.shape[1])
    decode.capture()
    decode.run(fb)
    replay = decode.graphs[1].replay
    t_dec, d_dec = cuda_time(lambda: decode.run(fb), warmup=3, iters=50), back_to_back(replay, 50)
    log(f"decode, graph, batch 1: {t_dec * 1e3:.4f} ms a call, {d_dec * 1e3:.4f} ms replayed back to back")
    graph_timeline(lambda: decode.run(fb), log, top=args.top, label="decode")
    rows = [("decode", 1, t_dec, d_dec)]
    blocks = [int(b) for b in args.blocks.split(",")]
    variants = [("", True)] + ([(", shared experts in line", False)] if args.shared_stream_off else [])
    for suffix, shared_stream in variants:
        moe_ops.SHARED_STREAM = shared_stream
        for L in blocks:
            vfb = verify_batch(setup, L)
            runner = VerifyGraphRunner(model, setup.mem, (1,), L, setup.page_table.shape[1], ())
            runner.run(vfb)
            graph = runner.graphs[(1, L)]
            t, d = cuda_time(lambda: runner.run(vfb), warmup=3, iters=50), back_to_back(graph.replay, 50)
            rows.append((f"verify {L}{suffix}", L, t, d))
            log(f"verify{suffix}, graph, batch 1, block {L}: {t * 1e3:.4f} ms a call ({t / t_dec:.2f} decode calls), "
                f"{d * 1e3:.4f} ms back to back ({d / d_dec:.2f} decode steps)")
            if L == max(blocks):
                graph_timeline(lambda: runner.run(vfb), log, top=args.top, label=f"verify block {L}{suffix}")
    moe_ops.SHARED_STREAM = True
    log(f"\n| graph ({args.preset}, batch 1, ctx {args.ctx}) | tokens | ms a call | ms back to back | decode steps "
        "(back to back) |\n|---|---|---|---|---|")
    for name, n, t, d in rows:
        log(f"| {name} | {n} | {t * 1e3:.4f} | {d * 1e3:.4f} | {d / d_dec:.2f} |")


if __name__ == "__main__":
    main()
