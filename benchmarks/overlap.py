"""The overlap scheduler against serial scheduling, on one engine, at batch 1 (issue 4): decode tok/s from each
request's first token to its last, the two modes in interleaved rounds, beside the decode step's CUDA graph
replayed alone (the device's share of a step; the rest of a serial step is host work the overlap can hide).
A third mode overlaps but samples after the replay (`ModelRunner.graph_greedy` off), where the engine otherwise
takes a plain greedy step's tokens from the decode graph's own argmax; the graph still takes its argmax there, so
that mode carries two small kernels more than the engine did before the graph took it. A fourth overlaps launches
of several decode steps (`--decode-steps`, the engine's `--num-continuous-decode-steps`).
--timeline (CUDA) also traces overlapped engine steps and the graph replayed alone under the profiler: each kernel
and copy charged with how far it moved the step's end, so what the engine adds to the graph shows by name.

    PYTHONPATH=. python benchmarks/overlap.py [--model k3-mini --device cuda --dtype bfloat16] [--rounds 3] \
        [--decode-steps 4] [--timeline]

The same engine serves both modes: its scheduler's overlap is switched on and off between rounds (on a CPU the
overlapped batches run on the forward thread; on a GPU they are launched from the scheduler's own thread).
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import replay_ms  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.engine.model_runner import ForwardThread  # noqa: E402


def decode_rate(core: EngineCore, prompts, new: int) -> float:
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    tokens, seconds = 0, 0.0
    for p in prompts:
        req = core.make_request(p, params)
        core.add_request(req)
        while core.has_work():
            core.step()
        tokens += len(req.output_ids) - 1
        seconds += req.finished_at - req.first_token_at
    return tokens / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=4,
                    help="a fourth mode: overlap with launches of this many decode steps (--num-continuous-decode-steps;"
                         " 1: no such mode)")
    ap.add_argument("--timeline", action="store_true", help="profile overlapped engine steps against the graph alone")
    args = ap.parse_args()
    core = EngineCore(ServerArgs(model_path=args.model, device=args.device, dtype=args.dtype, skip_tokenizer_init=True,
                                 max_running_requests=1, cuda_graph_max_bs=1,
                                 num_continuous_decode_steps=args.decode_steps))
    sched = core.scheduler
    sched.serial_single = False  # on a CPU a one-request batch otherwise never uses the forward thread
    if sched.forward is None and core.runner.device.type != "cuda":  # a CPU computes on the forward thread
        sched.forward = ForwardThread(core.runner)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, core.cfg.vocab_size, (64,), generator=gen).tolist() for _ in range(args.prompts)]
    decode_rate(core, prompts, 8)  # warm-up: compiles, the prefill shape
    launches = f"overlap, {args.decode_steps} decode steps a launch"
    rates = {"serial": [], "overlap": [], "overlap, argmax after the graph": []}
    if args.decode_steps > 1:
        rates[launches] = []
    for _ in range(args.rounds):
        for mode in rates:
            sched.overlap = mode.startswith("overlap")
            core.runner.graph_greedy = mode != "overlap, argmax after the graph"
            sched.decode_steps = args.decode_steps if mode == launches else 1
            rates[mode].append(decode_rate(core, prompts, args.new_tokens))
    core.runner.graph_greedy, sched.decode_steps = True, 1
    g = replay_ms(core.runner.graphs.graphs[1]) if core.runner.graphs is not None else None
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"# overlap {time.strftime('%Y-%m-%d %H:%M:%S')} {args.model} on {args.device} ({args.dtype}), batch 1, "
          f"{args.prompts} prompts x {args.new_tokens} tokens, {args.rounds} interleaved rounds")
    for mode, v in rates.items():
        print(f"   {mode:31s} {med[mode]:8.1f} tok/s = {1e3 / med[mode]:.3f} ms a token (rounds "
              + ", ".join(f"{x:.1f}" for x in v) + ")")
    print(f"   overlap / serial: x{med['overlap'] / med['serial']:.2f}; the graph's argmax / argmax after the graph: "
          f"x{med['overlap'] / med['overlap, argmax after the graph']:.3f}"
          + (f"; {args.decode_steps} decode steps a launch / one: x{med[launches] / med['overlap']:.3f}"
             if launches in med else ""))
    if g is not None:
        print(f"   decode graph alone: {g:.3f} ms a step (the device's share; a step cannot beat it)")
    if args.timeline and g is not None:
        timelines(core, prompts[0])
    core.shutdown()


def timelines(core: EngineCore, prompt, steps: int = 30) -> None:
    """Overlapped engine decode steps of one request, then its decode graph replayed alone, each traced (see
    decode_ladder.graph_timeline; copies charged too)."""
    from benchmarks.common import graph_timeline

    core.scheduler.overlap = True
    req = core.make_request(prompt, {"max_new_tokens": 4 * steps + 16, "temperature": 0, "ignore_eos": True})
    core.add_request(req)
    while len(req.output_ids) < 4:
        core.step()
    graph_timeline(core.step, print, steps=steps, top=25, label="engine decode steps, overlap on", copies=True)
    graph = core.runner.graphs.graphs[1]
    graph_timeline(graph.replay, print, steps=steps, top=12, label="decode graph replayed alone", copies=True)
    while core.has_work():
        core.step()


if __name__ == "__main__":
    main()
