"""Which engine steps take far longer than their kind usually does (a kernel variant compiled on first use, a CUDA
graph captured late, an allocator stall), with the batch that ran: a diagnosis aid, not a figure.

    python benchmarks/slow_steps.py --device cuda --dtype bfloat16 [--speculative] [--threshold-ms 50]

Runs speculative.py's batch-1 protocol (a warm-up generate of 8 tokens over the prompts, then a timed one of
--new-tokens) and prints every scheduler step over the threshold in the timed run, with its forward mode and the
batch's extend and prefix lengths, and the runner calls inside it. Each step is timed to a device synchronisation.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.speculative import generate, heldout_prompts, make  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--disable-pdl", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threshold-ms", type=float, default=50.0)
    ap.add_argument("--sides", default="plain,dspark,dspark+overlap")
    args = ap.parse_args()
    base = make(args)
    sets = heldout_prompts(base.tokenizer, args.prompts)
    base.shutdown()
    prompts = sets["code"][: args.prompts // 2] + sets["arithmetic"][: args.prompts // 2]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for side in args.sides.split(","):
        kw = {"max_running_requests": 1}
        if side.startswith("dspark"):
            kw["speculative_algorithm"] = "dspark"
        if side.endswith("+overlap"):
            kw["disable_overlap_schedule"] = False
        core = make(args, **kw)
        generate(core, prompts, 8)
        calls = []
        run = core.runner.run

        def timed_run(b, _run=run):
            t = time.perf_counter()
            out = _run(b)
            calls.append((b.mode.name, list(b.extend_lens)[:4], list(b.prefix_lens)[:4], time.perf_counter() - t))
            return out

        core.runner.run = timed_run
        step = core.step
        slow, n, total = [], 0, 0.0

        def timed_step(_step=step):
            nonlocal n, total
            calls.clear()
            sync()
            t = time.perf_counter()
            out = _step()
            sync()
            dt = time.perf_counter() - t
            n, total = n + 1, total + dt
            if dt * 1e3 > args.threshold_ms:
                slow.append((dt, list(calls)))
            return out

        core.step = timed_step
        generate(core, prompts, args.new_tokens)
        core.shutdown()
        print(f"== {side}: {n} steps, {total:.3f} s, {len(slow)} over {args.threshold_ms:.0f} ms")
        for dt, cs in slow:
            inner = "; ".join(f"{m} ext {e} pre {p} {c * 1e3:.1f} ms" for m, e, p, c in cs)
            print(f"   {dt * 1e3:8.1f} ms: {inner}")


if __name__ == "__main__":
    main()
