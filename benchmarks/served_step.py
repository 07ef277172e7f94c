"""Where the served batch-1 speculative step's time goes beyond its graph: the same step timed with each layer of
the serving path added in turn, back to back (the engine's overlapped steady state), turn about.

    PYTHONPATH=. python benchmarks/served_step.py [--rounds 5] [--steps 200] [--new-tokens 512]

The engine (CUDA, bf16, DSpark with context lookup, as served) decodes one request so that its step graph is
captured, and the worker's last greedy batch and step inputs are kept. Then, per step:
- graph: the step graph replayed alone;
- + ints copy: the step's integers copied in (host to device, pageable), then the replay;
- + both copies: the integers and the page table copied in, then the replay (what `SpecStepGraphRunner.run` does);
- + result copy: and the packed result copied out into pinned memory (`BatchResult.pending`), the step before's
  resolved after the launch (as the scheduler does);
- worker, k steps a launch: `SpecWorker._run_greedy` on the kept batch (chained: the same request) as a launch of
  k verify steps (`Batch.launch_steps`), and the launch before's deferred result resolved: the worker's whole host
  path without the scheduler, per verify step;
- served, k steps a launch: the engine's decode of one request of --new-tokens tokens (ignore_eos), scheduler
  included, per verify step, with launches of k steps at most (`Scheduler.launch_steps`).
The differences between rows are what each layer adds to a step on the device's clock; a row whose wall exceeds
the graph by more than its copies is host-bound. Timing only: the repeated steps rewrite the finished request's
state slot.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import replay_ms, stamp  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.batch import BatchResult  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402


def per_step(fn, steps: int) -> float:
    """Wall ms per call of fn over `steps` calls issued back to back (one warm-up call, the queue drained before
    and after)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=512)
    args = ap.parse_args()
    core = EngineCore(ServerArgs(dtype="bfloat16", device="cuda", speculative_algorithm="dspark",
                                 speculative_context_lookup="on", max_running_requests=1))
    worker = core.runner.spec
    sg = worker.step_graphs
    kept = {}
    run_greedy, sg_run = worker._run_greedy, sg.run

    def keep_batch(b, keep, *a):
        kept["batch"], kept["keep"] = b, list(keep)
        return run_greedy(b, keep, *a)

    def keep_inputs(features, ints, table, windows=None):
        if table is not None:  # (a launch's later steps reuse the first one's table)
            kept["ints"], kept["table"] = ints.clone(), table.clone()
        return sg_run(features, ints, table, windows)

    worker._run_greedy, sg.run = keep_batch, keep_inputs
    vocab = core.model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)

    def serve(new: int, launch_steps: int = 1) -> tuple[float, int]:
        """(wall ms per verify step, verify steps) of one request decoded with launches of up to `launch_steps`."""
        core.scheduler.launch_steps = launch_steps
        prompt = torch.randint(3, vocab, (32,), generator=gen).tolist()
        req = core.make_request(prompt, {"max_new_tokens": new, "temperature": 0, "ignore_eos": True})
        core.add_request(req)
        while req.first_token_at is None:
            core.step()
        steps, start = req.spec_verify_ct, time.perf_counter()
        while core.has_work():
            core.step()
        steps = req.spec_verify_ct - steps
        return (time.perf_counter() - start) / steps * 1e3, steps

    serve(48)
    worker._run_greedy, sg.run = run_greedy, sg_run
    b, keep, ints, table = kept["batch"], kept["keep"], kept["ints"], kept["table"]
    bucket = ints.shape[1]
    graph = sg.graphs[bucket]
    rid = b.reqs[0].rid  # (finished: its features and window are back for the repeated steps)
    worker.features[rid] = sg.features[0].clone()
    if sg.windows is not None:
        worker.windows[rid] = sg.windows[0].clone()

    def copies(table_too: bool):
        def step():
            sg._ints(bucket).copy_(ints, non_blocking=True)
            if table_too:
                sg.table[:bucket, : table.shape[1]].copy_(table, non_blocking=True)
            graph.replay()
        return step

    pending = {"last": None}

    def with_result():
        out = sg.run(None, ints, table)
        res = BatchResult.pending(out[0][:1])
        if pending["last"] is not None:
            pending["last"].resolve()
        pending["last"] = res

    spare = core.runner.future_size - 1  # (a future entry no request uses: the first step's of a 2-step launch)
    launches = {1: dataclasses.replace(b, launch_steps=1, step_futures=None),
                2: dataclasses.replace(b, launch_steps=2, step_futures=[[spare]])}

    def worker_launch(steps: int):
        def run():
            res = worker._run_greedy(launches[steps], keep, worker._bucket(1), False, time.perf_counter())
            if pending["last"] is not None:
                pending["last"].resolve()
            pending["last"] = res
        return run

    def drained(fn):
        def run():
            fn()
            if pending["last"] is not None:
                pending["last"].resolve()
                pending["last"] = None
        return run

    rows = {"graph": [], "+ ints copy": [], "+ both copies": [], "+ result copy": [], "worker, 1 step a launch": [],
            "worker, 2 steps a launch": [], "served, 1 step a launch": [], "served, 2 steps a launch": []}
    served_steps = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            rows["graph"].append(replay_ms(graph, args.steps))
            rows["+ ints copy"].append(per_step(copies(False), args.steps))
            rows["+ both copies"].append(per_step(copies(True), args.steps))
            rows["+ result copy"].append(per_step(with_result, args.steps))
            drained(lambda: None)()
            for k in (1, 2):
                rows[f"worker, {k} step{'s' if k > 1 else ''} a launch"].append(
                    per_step(worker_launch(k), args.steps // k) / k)
                drained(lambda: None)()
            worker._settle_resident()
            for k in (1, 2):
                ms, n = serve(args.new_tokens, k)
                rows[f"served, {k} step{'s' if k > 1 else ''} a launch"].append(ms)
                served_steps.append(n)
    print(f"\n{stamp()}  {torch.cuda.get_device_name()}, k3-small + drafter, bf16, batch 1, DSpark + lookup "
          f"({args.rounds} rounds x {args.steps} steps, turn about; served: {statistics.median(served_steps)} verify "
          f"steps of a {args.new_tokens}-token request)")
    base = statistics.median(rows["graph"])
    print("| layer | ms a verify step (median) | min | max | over the graph (us) |\n|---|---|---|---|---|")
    for label, ts in rows.items():
        med = statistics.median(ts)
        print(f"| {label} | {med:.4f} | {min(ts):.4f} | {max(ts):.4f} | {(med - base) * 1e3:+.1f} |")
    core.shutdown()


if __name__ == "__main__":
    main()
