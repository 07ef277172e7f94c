"""Output throughput of --dp-size replicas against one engine, in one run.

    python benchmarks/data_parallel.py [--model k3-small] [--device cpu|cuda] [--dp-size 1,2] [--requests 256]
                                       [--concurrency 64] [--prompt-len 128] [--new-tokens 128] [--rounds 3]

Each dp size gets its own engine in turn, with max_running_requests = concurrency / dp, so the total concurrency is
the same; each runs --rounds batches of the same random prompts (greedy, ignore_eos) after a warm-up, and the median
output tok/s is compared with dp 1's. On GPUs replica r runs on GPU r; on a CPU the replicas split the torch threads
(for the CPU against a plain loop, see offline_throughput.py --dp-size).
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--dp-size", default="1,2")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="KV capacity of each replica")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (args.prompt_len,), generator=gen).tolist() for _ in range(args.requests)]
    params = {"max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}
    rows = []
    for dp in map(int, args.dp_size.split(",")):
        assert args.concurrency % dp == 0, f"dp size {dp} does not divide the concurrency {args.concurrency}"
        kw = dict(device=args.device, dtype=args.dtype, skip_tokenizer_init=True, disable_radix_cache=True,
                  max_running_requests=args.concurrency // dp, dp_size=dp)
        if args.max_total_tokens:
            kw["max_total_tokens"] = args.max_total_tokens
        with Engine(args.model, **kw) as engine:
            engine.generate(input_ids=prompts[: args.concurrency], sampling_params={**params, "max_new_tokens": 4})
            runs, outs = [], None
            for _ in range(args.rounds):
                start = time.perf_counter()
                outs = engine.generate(input_ids=prompts, sampling_params=params)
                runs.append(args.requests * args.new_tokens / (time.perf_counter() - start))
            assert all(len(o["output_ids"]) == args.new_tokens for o in outs)
        tps = statistics.median(runs)
        rows.append((dp, tps, runs))
        print(f"dp {dp}: {tps:.1f} tok/s (rounds: {', '.join(f'{r:.1f}' for r in runs)})", flush=True)
    base = rows[0][1]
    print(f"\n{args.model}, {args.requests} requests of {args.prompt_len} + {args.new_tokens} tokens at concurrency "
          f"{args.concurrency}\n\n| dp size | output tok/s (median) | against dp {rows[0][0]} |\n|---|---|---|")
    for dp, tps, _ in rows:
        print(f"| {dp} | {tps:.1f} | {tps / base:.2f}x |")


if __name__ == "__main__":
    main()
