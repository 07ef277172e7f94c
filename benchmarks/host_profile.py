"""Where the engine's batch-1 decode time goes on the host: plain and DSpark decoding of the bundled model, each
timed, then profiled with cProfile (own time and cumulative time of the heaviest functions).

    python benchmarks/host_profile.py [--device cuda --dtype bfloat16] [--prompts 4] [--new-tokens 64] [--top 25]
                                       [--timeline]

cProfile slows Python-heavy code more than kernels, so the profiled run's share of host work is an upper bound;
the timed run before it is the figure to quote.
"""

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import graph_timeline, replay_ms  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.ops import dspark as dspark_ops  # noqa: E402
from kestrel.ops import linear as linear_ops  # noqa: E402


def run(core: EngineCore, prompts, new: int) -> tuple[float, int, float]:
    """Seconds to generate `new` tokens for each prompt (one request at a time), the engine steps taken, and the
    decode tok/s (each request's first token to its last: prefill excluded)."""
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    steps, start, decode_s = 0, time.perf_counter(), 0.0
    for p in prompts:
        req = core.make_request(p, params)
        core.add_request(req)
        while core.has_work():
            core.step()
            steps += 1
        decode_s += req.finished_at - req.first_token_at
    return time.perf_counter() - start, steps, len(prompts) * (new - 1) / decode_s if decode_s else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--modes", default="plain,dspark",
                    help="comma-separated: plain, dspark, and dspark-unfused (the drafter's corrections as module "
                         "ops and small linears of more than one row on cuBLAS, as before those kernels); a mode "
                         "ending in +overlap runs with the overlap scheduler (speculative steps chained)")
    ap.add_argument("--disable-pdl", action="store_true",
                    help="plain launches: the kernel table's times are then each kernel's own (under PDL a kernel's "
                         "time includes its wait for the one before)")
    ap.add_argument("--timeline", action="store_true",
                    help="also list the step graph's kernels in order, each charged with how far it moved the "
                         "step's end (a replay traced kernel by kernel)")
    ap.add_argument("--served-timeline", action="store_true",
                    help="also trace served decode steps (engine steps in the middle of one long request, copies "
                         "included), each kernel or copy charged with how far it moved the steps' end: what the "
                         "served step runs beyond its graph")
    ap.add_argument("--context-lookup", default="auto", choices=["auto", "on", "off"],
                    help="the DSpark modes' --speculative-context-lookup")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    small_rows, kernel_rows = linear_ops.SMALL_GEMV_MAX_M, dspark_ops.KERNEL_MAX_ROWS
    for mode in args.modes.split(","):
        unfused = mode.startswith("dspark-unfused")
        linear_ops.SMALL_GEMV_MAX_M = linear_ops.GEMV_MAX_M if unfused else small_rows
        dspark_ops.KERNEL_MAX_ROWS = 0 if unfused else kernel_rows
        kw = ({"speculative_algorithm": "dspark", "speculative_context_lookup": args.context_lookup}
              if mode.startswith("dspark") else {})
        core = EngineCore(ServerArgs(dtype=args.dtype, device=args.device,
                                     disable_overlap_schedule=not mode.endswith("+overlap"),
                                     max_running_requests=1, disable_pdl=args.disable_pdl, **kw))
        vocab = core.model.cfg.vocab_size
        prompts = [torch.randint(3, vocab, (32,), generator=gen).tolist() for _ in range(args.prompts)]
        run(core, prompts[:1], 16)  # warm-up (first-use compiles and captures)
        elapsed, steps, decode = run(core, prompts, args.new_tokens)
        tokens = len(prompts) * args.new_tokens
        print(f"== {mode}: decode {decode:.1f} tok/s; end to end {tokens / elapsed:.1f} tok/s, "
              f"{elapsed / steps * 1e3:.3f} ms a step, {tokens / steps:.2f} tokens a step ({steps} steps, "
              f"{len(prompts)} of them prefills)")
        prof = cProfile.Profile()
        prof.enable()
        p_elapsed, p_steps, _ = run(core, prompts, args.new_tokens)
        prof.disable()
        print(f"   profiled: {p_elapsed / p_steps * 1e3:.3f} ms a step")
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
            lines = buf.getvalue().splitlines()
            start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
            print(f"   by {key} (per-step ms = tottime or cumtime / {p_steps} steps x 1000):")
            for line in lines[start : start + args.top + 1]:
                print("   " + line[:160])
        if args.device == "cuda":
            kernel_table(core, prompts[:2], args)
            if args.served_timeline:
                served_timeline(core, prompts[0], mode)
            graph_time(core, mode, args.timeline)
        core.shutdown()


def kernel_table(core: EngineCore, prompts, args) -> None:
    """The GPU kernels of decode steps alone (CUDA-graph replays traced kernel by kernel): the requests profiled once
    with their tokens and once stopping after the first (the prefills alone), and the difference taken per kernel.
    Launches and time per decode step, heaviest first."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(new: int) -> tuple[dict, int]:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _, steps, _ = run(core, prompts, new)
            torch.cuda.synchronize()
        agg = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                n, t = agg.get(e.name, (0, 0.0))
                agg[e.name] = (n + 1, t + e.device_time_total)
        return agg, steps

    whole, steps = kernels(args.new_tokens)
    prefill, prefill_steps = kernels(1)
    steps -= prefill_steps
    agg = {k: (n - prefill.get(k, (0, 0.0))[0], t - prefill.get(k, (0, 0.0))[1]) for k, (n, t) in whole.items()}
    total_n, total_t = sum(n for n, _ in agg.values()), sum(t for _, t in agg.values())
    print(f"   GPU kernels of decode steps ({steps}, prefills subtracted): {total_n / steps:.0f} a step, "
          f"{total_t / steps / 1e3:.3f} ms of kernel time a step; heaviest (launches a step, us a step):")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"   {n / steps:7.1f} {t / steps:9.1f}  {name[:100]}")


def served_timeline(core: EngineCore, prompt, mode: str, steps: int = 20) -> None:
    """Engine steps of one request in mid-decode traced with their copies: with the step graph's own timeline, what
    the served step runs beyond its graph (copies, eager kernels, the gaps the host leaves)."""
    req = core.make_request(prompt, {"max_new_tokens": 1024, "temperature": 0, "ignore_eos": True})
    core.add_request(req)
    for _ in range(8):  # past the prefill and the first decode steps
        core.step()
    graph_timeline(core.step, lambda s: print("   " + s), steps=steps, top=30, copies=True,
                   label=f"{mode}, served steps")
    core.abort(req.rid)
    while core.has_work():
        core.step()


def graph_time(core: EngineCore, mode: str, timeline: bool = False, replays: int = 200) -> None:
    """The device time of one batch-1 step alone: its CUDA graph replayed back to back (the decode graph; for DSpark
    the whole greedy step's graph). The step's wall time less this is what the host adds. Run last: the replays
    rewrite the last request's (freed) state slot."""
    runner = core.runner
    graphs = runner.spec.step_graphs.graphs if mode.startswith("dspark") else runner.graphs.graphs
    graph = graphs[min(graphs)]
    print(f"   graph alone: {replay_ms(graph, replays):.3f} ms of device time a step (batch "
          f"{min(graphs)}, {replays} replays back to back)")
    if timeline:
        graph_timeline(graph.replay, lambda s: print("   " + s), label=f"{mode}, batch {min(graphs)}", top=30,
                       sequence=range(0, 400))
    if mode.startswith("dspark"):  # the phases, from the host-acceptance path's graphs of the same bucket
        spec, b = runner.spec, min(graphs)
        key = (b, spec.gamma + 1)
        phases = {"draft": spec.draft_graphs.graphs.get((b, False)), "verify": spec.graphs.graphs.get(key),
                  "fold": spec.graphs.fold_graphs.get(key)}
        print("   phases alone (ms): " + ", ".join(f"{name} {replay_ms(g, replays):.3f}"
                                                    for name, g in phases.items() if g is not None))


if __name__ == "__main__":
    main()
