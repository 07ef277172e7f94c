"""Where a batch-1 decode step's host time goes, without cProfile's distortion: wall time summed per function
(plain perf_counter wrappers around the scheduler's, runner's and graphs' entry points), and the host cost of one
CUDA-graph launch when the device is idle, when the same graph is still running, and when another graph is.

    python benchmarks/host_timers.py --device cuda --dtype bfloat16 [--modes plain,dspark+overlap] [--rounds 3]

First each mode's decode tok/s (batch 1, each request's first token to its last), the modes taking turns for
--rounds rounds, and the ratios of their medians to the first mode's; then one wrapped run per mode. Wrapped
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
from benchmarks.common import replay_ms  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine import cuda_graph, model_runner, scheduler  # noqa: E402
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


def decode_run(core: EngineCore, prompts, new: int, totals: dict | None = None) -> tuple[float, int]:
    """Decode tok/s over `prompts` one request at a time (first token to last) and the decode steps taken; with
    `totals`, the wrappers count only decode steps (each request's prefill runs before they are switched on)."""
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    steps, decode_s, saved = 0, 0.0, None
    for p in prompts:
        req = core.make_request(p, params)
        core.add_request(req)
        while req.first_token_at is None:
            core.step()
        if totals is not None:
            saved = wrap(totals)
        try:
            while core.has_work():
                core.step()
                steps += 1
        finally:
            for cls, name, fn in saved or []:
                setattr(cls, name, fn)
        decode_s += req.finished_at - req.first_token_at
    return len(prompts) * (new - 1) / decode_s, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the bundled k3-small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per mode, modes taking turns")
    ap.add_argument("--modes", default="plain,dspark+overlap")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    cores, modes = {}, args.modes.split(",")
    for mode in modes:
        kw = {"speculative_algorithm": "dspark"} if mode.startswith("dspark") else {}
        cores[mode] = EngineCore(ServerArgs(model_path=args.model, dtype=args.dtype, device=args.device,
                                            max_running_requests=1, skip_tokenizer_init=args.model is not None,
                                            max_total_tokens=1 << 16, disable_overlap_schedule=not mode.endswith("+overlap"), **kw))
    vocab = cores[modes[0]].model.cfg.vocab_size
    prompts = [torch.randint(3, vocab, (32,), generator=gen).tolist() for _ in range(args.prompts)]
    for core in cores.values():
        decode_run(core, prompts[:1], 16)  # first-use compiles and captures
    rates = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            rates[mode].append(decode_run(cores[mode], prompts, args.new_tokens)[0])
    for mode in modes:
        core = cores[mode]
        totals = defaultdict(lambda: [0, 0.0])
        rate, steps = decode_run(core, prompts, args.new_tokens, totals)
        print(f"== {mode}: decode {statistics.median(rates[mode]):.1f} tok/s (median of rounds "
              f"{', '.join(f'{r:.1f}' for r in rates[mode])}); wrapped {rate:.1f}; per decode step ({steps}): "
              "calls, host ms")
        for key, (n, sec) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            print(f"   {key:40s} {n / steps:6.2f} {sec / steps * 1e3:8.3f}")
        if args.device == "cuda":
            r = core.runner
            graphs = []
            if mode.startswith("dspark"):
                graphs.append(r.spec.step_graphs.graphs[min(r.spec.step_graphs.graphs)])
            graphs.append(r.graphs.graphs[min(r.graphs.graphs)])
            print("   graph alone: " + ", ".join(f"{replay_ms(g):.3f} ms" for g in graphs) + "; launch, host us: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in launch_costs(graphs).items()))
    base = statistics.median(rates[modes[0]])
    print("ratios to " + modes[0] + ": " + ", ".join(f"{m} {statistics.median(rates[m]) / base:.2f}x" for m in modes[1:]))
    for core in cores.values():
        core.shutdown()


if __name__ == "__main__":
    main()
