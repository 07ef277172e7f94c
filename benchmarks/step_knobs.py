"""The engine's greedy speculative step graph (bundled k3-small + drafter, batch 1) under different module settings
("knobs"), timed turn about.

    PYTHONPATH=. python benchmarks/step_knobs.py --knob kestrel.ops.dspark.BLOCK_ATTENTION=True,False \
        [--knob kestrel.ops.moe.SHARED_STREAM=True,False] [--rounds 6] [--replays 200]

The engine (CUDA, bf16, DSpark with context lookup, one running request) serves one request so that its step graph
is captured; then, for the baseline (every knob at its first value) and for each other value of each knob (the rest
at their first values), the step graph is captured again under those settings. The graphs are replayed back to back,
turn about, `--rounds` times `--replays` replays each (the device's share of a chained step), and each one's kernels
are counted from one traced replay. The replays rewrite the finished request's state slot: timing only (drafts and
outputs may differ between variants where a knob changes rounding; the GPU tests check each path).
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import cuda_events, parse_knob, replay_ms, stamp  # noqa: E402
from benchmarks.decode_knobs import _set  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402


def variants(specs: list[str]) -> list[tuple[str, dict]]:
    """[(label, {(module, name): value})]: the baseline (every knob's first value), then one knob moved at a time."""
    knobs = [parse_knob(s) for s in specs]
    base = {(mod, name): values[0] for mod, name, values in knobs}
    out = [("baseline", dict(base))]
    for mod, name, values in knobs:
        for v in values[1:]:
            out.append((f"{name}={v!r}", {**base, (mod, name): v}))
    return out


def capture(core: EngineCore, settings: dict):
    """The step graph of batch bucket 1, captured again under `settings` (restored afterwards)."""
    runner = core.runner.spec.step_graphs
    old = _set(settings)
    try:
        runner.graphs.pop(1, None)
        runner.outputs.pop(1, None)
        runner.ensure(1)
        return runner.graphs[1]
    finally:
        _set(old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--knob", action="append", required=True,
                    help="module.NAME=value,value,... (Python literals; the first: baseline); repeatable")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--replays", type=int, default=200)
    args = ap.parse_args()
    cases = variants(args.knob)
    core = EngineCore(ServerArgs(dtype="bfloat16", device="cuda", speculative_algorithm="dspark",
                                 speculative_context_lookup="on", max_running_requests=1))
    vocab = core.model.cfg.vocab_size
    prompt = torch.randint(3, vocab, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    req = core.make_request(prompt, {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True})
    core.add_request(req)
    while core.has_work():
        core.step()
    graphs = {label: capture(core, s) for label, s in cases}
    kernels = {label: sum(e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
                          and "memset" not in e.name.lower() for e in cuda_events(g.replay, 1))
               for label, g in graphs.items()}
    times = {label: [] for label in graphs}
    for _ in range(args.rounds):
        for label, g in graphs.items():
            times[label].append(replay_ms(g, args.replays))
    base = statistics.median(times["baseline"])
    print(f"\n{stamp()}  {torch.cuda.get_device_name()}, k3-small + drafter, bf16, batch 1, step graph "
          f"({args.rounds} rounds x {args.replays} replays, turn about)")
    print("| variant | ms a step (median) | min | kernels | vs baseline |\n|---|---|---|---|---|")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"| {label} | {med:.4f} | {min(ts):.4f} | {kernels[label]} | {base / med:.3f}x |")
    core.shutdown()


if __name__ == "__main__":
    main()
