"""The HTTP server against the offline Engine on one workload, in one run: the front end must never be the
bottleneck (target: server throughput >= 90% of offline).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/serving.py [--models k3-tiny,k3-small] [--num-prompts 256] \
        [--input-len 128] [--output-len 64] [--concurrency 64] [--repeats 3]

Workload: random token-id prompts of fixed length, fixed output lengths, greedy, ignore_eos. Four measurements,
each as output tokens per second:
  offline  one Engine.generate call over all prompts (the engine admits the next prompt the step one finishes);
  closed   the same engine in-process fed like the server is: a new request added once one has finished;
  core     the engine-core process behind ZMQ (the server's channel, no HTTP), all prompts sent at once;
  server   `kestrel serve` in a subprocess, `kestrel bench`'s client streaming /generate with `--concurrency`
           requests in flight (a new one once one finishes), as a user would see it.
Every engine runs at most `--concurrency` requests at once (max_running_requests), so the batches match. core /
offline is the cost of the process split; closed / offline the cost of closed-loop arrivals alone; server / closed
what HTTP, detokenising, streaming and the client add on top (a replacement reaches the engine some steps after
the request it replaces finished, so replacements trickle in over several steps).
With --repeats > 1 the three alternate and the medians are compared (a shared machine is noisy). k3-small is the
bundled model when its checkpoint is there, random weights of its shape otherwise.
"""

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine, ServerArgs  # noqa: E402
from kestrel.engine.request import Req  # noqa: E402
from kestrel.engine.sampling_params import SamplingParams  # noqa: E402
from kestrel.models.registry import bundled_available  # noqa: E402
from kestrel.server import bench  # noqa: E402
from kestrel.server.engine_client import EngineClient  # noqa: E402
from kestrel.server.launch import LaunchedServer  # noqa: E402


def greedy(output_len: int) -> dict:
    return {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}


def offline(model: str, prompts: list[list[int]], output_len: int, concurrency: int, dtype: str) -> float:
    with Engine(model, dtype=dtype, max_running_requests=concurrency) as engine:
        engine.generate(input_ids=prompts[:2], sampling_params=greedy(4))  # warm-up
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=greedy(output_len))
        elapsed = time.perf_counter() - start
    assert all(len(o["output_ids"]) == output_len for o in outs)
    return len(prompts) * output_len / elapsed


def offline_closed_loop(model: str, prompts: list[list[int]], output_len: int, concurrency: int, dtype: str) -> float:
    """The engine in-process with the server's arrival pattern: `concurrency` requests in flight, the next one
    added the moment one finishes (no HTTP, no process split)."""
    with Engine(model, dtype=dtype, max_running_requests=concurrency) as engine:
        core = engine.core
        engine.generate(input_ids=prompts[:2], sampling_params=greedy(4))  # warm-up
        queue = [core.make_request(p, greedy(output_len)) for p in prompts]
        start = time.perf_counter()
        live = 0
        while queue or live:
            while queue and live < concurrency:
                core.add_request(queue.pop(0))
                live += 1
            live -= sum(1 for r in core.step() if r.finished)
        elapsed = time.perf_counter() - start
    return len(prompts) * output_len / elapsed


async def _core(model: str, prompts: list[list[int]], output_len: int, concurrency: int, dtype: str) -> float:
    client = EngineClient(ServerArgs(model_path=model, dtype=dtype, max_running_requests=concurrency))
    await client.start()
    try:
        def reqs(tag, ps, n):
            return [Req(f"{tag}{i}", p, SamplingParams(**greedy(n)), 0, 0) for i, p in enumerate(ps)]

        await (await client.submit(reqs("w", prompts[:2], 4), "warm-up", stream=False)).wait()
        start = time.perf_counter()
        group = await client.submit(reqs("r", prompts, output_len), "all", stream=False)
        await group.wait()
        elapsed = time.perf_counter() - start
        assert all(len(t.req.output_ids) == output_len for t in group.tracks)
        return len(prompts) * output_len / elapsed
    finally:
        await client.shutdown()


def core(*a) -> float:
    return asyncio.run(_core(*a))


def served(model: str, prompts: list[list[int]], output_len: int, concurrency: int, dtype: str) -> dict:
    flags = ["--model", model, "--dtype", dtype, "--max-running-requests", str(concurrency)]
    parser = argparse.ArgumentParser()
    bench.add_args(parser)
    args = parser.parse_args(["--max-concurrency", str(concurrency), "--disable-tqdm"])
    with LaunchedServer(flags) as srv:
        runner = bench.Runner(args, srv.url, {}, model, None, concurrency)
        run = asyncio.run(runner.run([bench.Request(p, output_len) for p in prompts]))
    assert run["completed"] == len(prompts), run["errors"]
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="k3-tiny,k3-small")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-file", default=None, help="JSON results")
    a = p.parse_args()
    results = []
    for model in a.models.split(","):
        rng = random.Random(a.seed)
        # ids past the special tokens of the bundled vocabulary; every preset's vocabulary is at least this big
        prompts = [[rng.randrange(8, 4096) for _ in range(a.input_len)] for _ in range(a.num_prompts)]
        label = model + (" (bundled)" if model == "k3-small" and bundled_available() else
                         " (random weights)" if model == "k3-small" else "")
        runs = {"offline": [], "closed": [], "core": [], "server": []}
        server_runs = []
        for _ in range(a.repeats):
            shape = (model, prompts, a.output_len, a.concurrency, a.dtype)
            runs["offline"].append(offline(*shape))
            runs["closed"].append(offline_closed_loop(*shape))
            gc.collect()
            runs["core"].append(core(*shape))
            server_runs.append(served(*shape))
            runs["server"].append(server_runs[-1]["output_throughput"])
            print(f"{label}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items()) + " tok/s", flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        last = server_runs[-1]
        results.append({"model": label, **{f"{k}_tok_s": v for k, v in med.items()},
                        "core_ratio": med["core"] / med["offline"], "server_ratio": med["server"] / med["offline"],
                        "server_vs_closed_loop": med["server"] / med["closed"],
                        "runs": runs, "server_p50_ttft_ms": last["p50_ttft_ms"],
                        "server_p50_itl_ms": last["p50_itl_ms"],
                        "server_p99_itl_ms": last["p99_itl_ms"]})
    print(f"\nconcurrency {a.concurrency}, {a.num_prompts} prompts of {a.input_len} tokens, {a.output_len} output "
          f"tokens each, greedy; median of {a.repeats}; output tokens/s")
    print(f"{'model':28s} {'offline':>9s} {'closed':>9s} {'core':>9s} {'server':>9s} {'core/off':>9s} "
          f"{'server/off':>11s} {'server/closed':>14s}")
    for r in results:
        print(f"{r['model']:28s} {r['offline_tok_s']:9.1f} {r['closed_tok_s']:9.1f} {r['core_tok_s']:9.1f} "
              f"{r['server_tok_s']:9.1f} {r['core_ratio']:9.1%} {r['server_ratio']:11.1%} "
              f"{r['server_vs_closed_loop']:14.1%}")
    print("target: server >= 90% of offline")
    if a.output_file:
        with open(a.output_file, "w") as f:
            json.dump({"config": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
