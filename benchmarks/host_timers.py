"""Where a batch-1 decode step's host time goes, without cProfile's distortion: wall time summed per function
(plain perf_counter wrappers around the scheduler's, runner's and graphs' entry points), and the host cost of one
CUDA-graph launch when the device is idle, when the same graph is still running, and when another graph is.

    python benchmarks/host_timers.py --device cuda --dtype bfloat16 [--modes plain,dspark+overlap] [--rounds 3]
        [--knob kestrel.engine.batch.REUSE_PINNED=True,False]

First each mode's decode tok/s (batch 1 unless --batch, each wave's first token to its last), the modes taking turns for
--rounds rounds, and the ratios of their medians to the first mode's; then one wrapped run per mode. With --knob
(module.NAME=v1,v2,...), every mode runs under every value (the first: baseline), all of them taking turns. Wrapped
functions nest (the runner's `run` includes the graph's), so the columns do not add up; each is the mean per decode
step (the wrappers are switched on after each request's prefill).
"""

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import parse_knob, replay_ms  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine import batch, cuda_graph, model_runner, sampler, scheduler  # noqa: E402
from kestrel.engine import core as core_module  # noqa: E402
from kestrel.engine.batch import BatchResult  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.spec import worker  # noqa: E402

TIMED = [
    (scheduler.Scheduler, "step"), (scheduler.Scheduler, "_schedule"), (scheduler.Scheduler, "_process_done"),
    (scheduler.Scheduler, "_build"), (scheduler.Scheduler, "_build_verify"), (scheduler.Scheduler, "_process"),
    (scheduler.Scheduler, "_process_verify"), (model_runner.ModelRunner, "run"),
    (model_runner.ModelRunner, "to_device"), (worker.SpecWorker, "run"), (worker.SpecWorker, "_host_ints"),
    (cuda_graph.SpecStepGraphRunner, "run"), (cuda_graph.DecodeGraphRunner, "run"), (torch.cuda.CUDAGraph, "replay"),
    (BatchResult, "pending"), (BatchResult, "resolve"), (torch.cuda.Event, "synchronize"),
    (worker.SpecWorker, "_run_greedy"),
    (scheduler.Scheduler, "_chained_drafts"), (scheduler.Scheduler, "_chain_links"), (model_runner, "sample"),
    (cuda_graph.DecodeGraphRunner, "run_host"), (cuda_graph.DecodeGraphRunner, "host_ints"),
    (scheduler.Scheduler, "_reap"), (scheduler.Scheduler, "_running_work"), (scheduler.Scheduler, "_admit"),
    (worker.SpecWorker, "greedy_on_device"), (batch._HostCopies, "start"), (batch._HostCopies, "done"),
    (scheduler.Scheduler, "_check_finish"), (sampler.SamplingState, "advance"), (core_module.EngineCore, "step"),
]


def wrap(totals: dict) -> list:
    saved = []
    for cls, name in TIMED:
        fn = cls.__dict__[name] if name in cls.__dict__ else getattr(cls, name)
        key = f"{getattr(cls, '__name__', '?').split('.')[-1]}.{name}"
        is_cm = isinstance(fn, classmethod)
        inner = fn.__func__ if is_cm else fn

        def timed(*a, _fn=inner, _key=key, **kw):
            t = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                slot = totals[_key]
                slot[0] += 1
                slot[1] += time.perf_counter() - t

        saved.append((cls, name, fn))
        setattr(cls, name, classmethod(timed) if is_cm else timed)
    return saved


def launch_costs(graphs: list, trials: int = 30) -> dict[str, float]:
    """Median host us of one replay() call: device idle; right after the same graph's replay (still running);
    right after another graph's replay."""
    def median_us(first, second) -> float:
        times = []
        for _ in range(trials):
            torch.cuda.synchronize()
            if first is not None:
                first.replay()
            t = time.perf_counter()
            second.replay()
            times.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        return statistics.median(times) * 1e6

    g, other = graphs[0], graphs[-1]
    out = {"idle": median_us(None, g), "after itself": median_us(g, g)}
    if other is not g:
        out["after another graph"] = median_us(other, g)
    return out


def decode_run(core: EngineCore, prompts, new: int, totals: dict | None = None, batch: int = 1) -> tuple[float, int]:
    """Decode tok/s over `prompts`, `batch` requests at a time (the tokens each wave produces from its last first
    token to its last token, over that time: with chunked prefills a wave's early requests decode before that, and
    those tokens are left out), and the decode steps taken; with `totals`, the wrappers count only those steps."""
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    steps, decode_s, decoded, saved = 0, 0.0, 0, None
    for at in range(0, len(prompts), batch):
        reqs = [core.make_request(p, params) for p in prompts[at : at + batch]]
        for req in reqs:
            core.add_request(req)
        while any(req.first_token_at is None for req in reqs):
            core.step()
        start, before = time.monotonic(), sum(len(r.output_ids) for r in reqs)  # (the scheduler's clock)
        if totals is not None:
            saved = wrap(totals)
        try:
            while core.has_work():
                core.step()
                steps += 1
        finally:
            for cls, name, fn in saved or []:
                setattr(cls, name, fn)
        decode_s += max(r.finished_at for r in reqs) - start
        decoded += sum(len(r.output_ids) for r in reqs) - before
    return decoded / decode_s, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the bundled k3-small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32, help="random prompt tokens")
    ap.add_argument("--batch", type=int, default=1, help="requests decoded together (the prompts in waves of this)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per mode, modes taking turns")
    ap.add_argument("--modes", default="plain,dspark+overlap")
    ap.add_argument("--knob", default=None, help="module.NAME=v1,v2,...: every mode under every value")
    args = ap.parse_args()
    knob = None
    if args.knob:
        knob = parse_knob(args.knob)
    gen = torch.Generator().manual_seed(0)
    cores, modes = {}, args.modes.split(",")
    total = args.batch * (args.prompt_len + args.new_tokens + 16)  # (a wave must fit: no retraction)
    for mode in modes:
        kw = {"speculative_algorithm": "dspark"} if mode.startswith("dspark") else {}
        cores[mode] = EngineCore(ServerArgs(model_path=args.model, dtype=args.dtype, device=args.device,
                                            max_running_requests=args.batch, skip_tokenizer_init=args.model is not None,
                                            max_total_tokens=max(1 << 16, total), disable_overlap_schedule=not mode.endswith("+overlap"), **kw))
    vocab = cores[modes[0]].model.cfg.vocab_size
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]
    for core in cores.values():
        decode_run(core, prompts[: args.batch], 16, batch=args.batch)  # first-use compiles and captures
    # (label, mode, knob settings): each mode under each knob value
    cases = [(m, m, {}) for m in modes] if knob is None else [
        (f"{m} {knob[1]}={v!r}", m, {(knob[0], knob[1]): v}) for m in modes for v in knob[2]]

    def run(case, totals=None):
        old = {(mod, name): getattr(mod, name) for mod, name in case[2]}
        try:
            for (mod, name), value in case[2].items():
                setattr(mod, name, value)
            return decode_run(cores[case[1]], prompts, args.new_tokens, totals, args.batch)
        finally:
            for (mod, name), value in old.items():
                setattr(mod, name, value)

    rates = {c[0]: [] for c in cases}
    for _ in range(args.rounds):
        for case in cases:
            rates[case[0]].append(run(case)[0])
    for case in cases:
        mode = case[0]
        core = cores[case[1]]
        totals = defaultdict(lambda: [0, 0.0])
        rate, steps = run(case, totals)
        print(f"== {mode}: decode {statistics.median(rates[mode]):.1f} tok/s (median of rounds "
              f"{', '.join(f'{r:.1f}' for r in rates[mode])}); wrapped {rate:.1f}; per decode step ({steps}): "
              "calls, host ms")
        for key, (n, sec) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            print(f"   {key:40s} {n / steps:6.2f} {sec / steps * 1e3:8.3f}")
        if args.device == "cuda":
            r = core.runner
            graphs = []
            if mode.startswith("dspark"):
                steps_graphs = r.spec.step_graphs
                graphs.append(steps_graphs.graphs[steps_graphs.bucket(args.batch)])
            graphs.append(r.graphs.graphs[r.graphs.bucket(args.batch)])
            print("   graph alone: " + ", ".join(f"{replay_ms(g):.3f} ms" for g in graphs) + "; launch, host us: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in launch_costs(graphs).items()))
    first = cases[0][0]
    base = statistics.median(rates[first])
    print(f"ratios to {first}: " + ", ".join(f"{c[0]} {statistics.median(rates[c[0]]) / base:.2f}x" for c in cases[1:]))
    for core in cores.values():
        core.shutdown()


if __name__ == "__main__":
    main()
