"""GPU prefill of many prompts at once: the MLA layers' attention in one varlen launch (mla.PACKED_PREFILL) against one
sequence at a time, in the same run, turn about.

    PYTHONPATH=. python benchmarks/prefill_batch.py [--model k3-mini] [--prompts 64] [--prompt-len 64] [--rounds 5]

Each round generates one token for every prompt (so the time is the batch's prefill, its first token's sampling
and the engine's scheduling), once with packed attention and once without; prints the medians and their ratio.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine  # noqa: E402
from kestrel.models import mla  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-mini")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    engine = Engine(args.model, device="cuda", dtype=args.dtype, skip_tokenizer_init=True, disable_radix_cache=True,
                    max_running_requests=args.prompts)
    vocab = engine.core.model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]
    params = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}

    def timed(packed: bool) -> float:
        mla.PACKED_PREFILL = packed
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        torch.cuda.synchronize()
        timed.outs[packed] = [o["output_ids"] for o in outs]
        return time.perf_counter() - start

    timed.outs = {}
    for packed in (True, False):  # warm-up: compiles
        timed(packed)
    times = {True: [], False: []}
    for _ in range(args.rounds):
        for packed in (True, False):
            times[packed].append(timed(packed))
    mla.PACKED_PREFILL = True
    same = sum(a == b for a, b in zip(timed.outs[True], timed.outs[False]))
    tokens = args.prompts * args.prompt_len
    print(f"# prefill_batch {time.strftime('%Y-%m-%d %H:%M:%S')} {args.model} ({args.dtype}) on "
          f"{torch.cuda.get_device_name()}: {args.prompts} prompts x {args.prompt_len} tokens, one output token each, "
          f"{args.rounds} rounds turn about")
    for packed, label in ((True, "packed (one varlen launch)"), (False, "one sequence at a time")):
        t = statistics.median(times[packed])
        print(f"   {label:28s} {t * 1e3:8.2f} ms  {tokens / t:9.0f} prompt tok/s  (rounds "
              + ", ".join(f"{x * 1e3:.1f}" for x in times[packed]) + ")")
    print(f"   packed / per sequence: x{statistics.median(times[False]) / statistics.median(times[True]):.2f}; "
          f"first tokens equal for {same} of {args.prompts} prompts")
    engine.shutdown()


if __name__ == "__main__":
    main()
