"""Host time of the engine's own work per decode step at a large batch: the scheduler (building the batch, page
accounting, processing the results) and the runner's preparation of the forward, apart from the model's forward.

    OMP_NUM_THREADS=1 python benchmarks/scheduler_host.py [--batches 64,256] [--model k3-tiny]

On a GPU this work is what a large-batch decode step can hide behind the device only while it stays shorter than
the device's step; measured here on the CPU with the smallest model, the forward timed apart and subtracted.
Serial scheduling (no overlap thread), so the times do not include waiting for another thread.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine  # noqa: E402
from kestrel.models.forward_batch import ForwardMode  # noqa: E402


def measure(name: str, batch: int, new_tokens: int, rounds: int, prompt_len: int = 8) -> dict[str, float]:
    eng = Engine(name, dtype="float32", skip_tokenizer_init=True, disable_radix_cache=True,
                 max_running_requests=batch, disable_overlap_schedule=True, max_total_tokens=batch * (prompt_len + new_tokens + 8),
                 chunked_prefill_size=max(8192, prompt_len))
    core, model = eng.core, eng.core.model
    gen = torch.Generator().manual_seed(0)
    forward = {"s": 0.0}
    inner = model.forward

    def timed_forward(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            forward["s"] += time.perf_counter() - t

    model.forward = timed_forward
    out = {"scheduler": [], "runner": [], "forward": []}
    for _ in range(rounds):
        prompts = [torch.randint(0, model.cfg.vocab_size, (prompt_len,), generator=gen).tolist() for _ in range(batch)]
        reqs = [core.make_request(p, {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
                for p in prompts]
        for r in reqs:
            core.add_request(r)
        while any(r.first_token_at is None for r in reqs):  # the prefills, untimed
            core.step()
        run = core.runner.run
        spent = {"run": 0.0, "steps": 0}

        def timed_run(b, _run=run):
            t = time.perf_counter()
            try:
                return _run(b)
            finally:
                if b.mode == ForwardMode.DECODE:
                    spent["run"] += time.perf_counter() - t
                    spent["steps"] += 1

        core.runner.run = timed_run
        forward["s"] = 0.0
        start = time.perf_counter()
        while core.has_work():
            core.step()
        wall = time.perf_counter() - start
        core.runner.run = run
        n = max(spent["steps"], 1)
        out["scheduler"].append((wall - spent["run"]) / n * 1e3)
        out["runner"].append((spent["run"] - forward["s"]) / n * 1e3)
        out["forward"].append(forward["s"] / n * 1e3)
    eng.shutdown()
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-tiny")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=8,
                    help="longer prompts make longer page tables (page size 1), which every step rebuilds")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# host ms per decode step, {args.model}, {args.prompt_len}-token prompts, median of {args.rounds} rounds "
          f"({args.new_tokens} tokens each)")
    print("| batch | scheduler | runner (forward excluded) | forward |")
    print("|---|---|---|---|")
    for b in map(int, args.batches.split(",")):
        m = measure(args.model, b, args.new_tokens, args.rounds, args.prompt_len)
        print(f"| {b} | {m['scheduler']:.3f} | {m['runner']:.3f} | {m['forward']:.3f} |")


if __name__ == "__main__":
    main()
