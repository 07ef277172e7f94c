"""GPU prefill of many prompts at once: the MLA layers' attention in one varlen launch (mla.PACKED_PREFILL) against one
sequence at a time, in the same run, turn about.

    PYTHONPATH=. python benchmarks/prefill_batch.py [--model k3-mini] [--prompts 64] [--prompt-len 64] [--rounds 5]
                                                   [--profile] [--sync-debug] [--ops] [--top N]
                                                   [--chunked-prefill-size N] [--disable-overlap-schedule]

Each round generates one token for every prompt (so the time is the batch's prefill, its first token's sampling
and the engine's scheduling), once with packed attention and once without; prints the medians and their ratio.
--profile then runs one more packed round under the torch profiler and prints its device time by kernel (with
launches) against the round's wall time: whether the prefill waits on its kernels or on the host. --sync-debug runs
one more packed round with torch's CUDA sync debug mode on and counts the synchronising operations by the source
line that called them (each one stalls the host until the device has drained its queue). --ops lists the ATen ops
of one more packed round that launched kernels, by op and innermost Kestrel call site, most frequent first (with
--disable-overlap-schedule: the profiler records the Python stacks of the calling thread only).
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
    ap.add_argument("--profile", action="store_true", help="one more packed round under the profiler: kernel table")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sync-debug", action="store_true", help="one more packed round: synchronising ops by caller")
    ap.add_argument("--ops", action="store_true", help="one more packed round: kernel-launching ops by call site")
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument("--disable-overlap-schedule", action="store_true",
                    help="forwards on the calling thread (the profiler records Python stacks there: --ops)")
    args = ap.parse_args()
    extra = {} if args.chunked_prefill_size is None else {"chunked_prefill_size": args.chunked_prefill_size}
    if args.disable_overlap_schedule:
        extra["disable_overlap_schedule"] = True
    engine = Engine(args.model, device="cuda", dtype=args.dtype, skip_tokenizer_init=True, disable_radix_cache=True,
                    max_running_requests=args.prompts, **extra)
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
    if args.profile:
        profile_round(lambda: timed(True), args.top)
    if args.sync_debug:
        sync_round(lambda: timed(True), args.top)
    if args.ops:
        ops_round(lambda: timed(True), args.top)
    engine.shutdown()


def ops_round(run, top: int) -> None:
    """One round profiled with Python stacks: the ATen ops that launched kernels, counted by (op, innermost Kestrel
    frame), with their kernels' names."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        run()
    counts, kernels, stacked = collections.Counter(), collections.defaultdict(collections.Counter), 0
    for e in prof.events():
        if e.device_type.name != "CPU" or not e.kernels or not e.name.startswith("aten::"):
            continue
        stacked += bool(e.stack)
        own = [f for f in (e.stack or []) if f.startswith("kestrel/") or "/kestrel/" in f]
        key = (e.name, "kestrel/" + own[0].split("kestrel/", 1)[-1] if own else "?")
        counts[key] += 1
        kernels[key].update(k.name[:32] for k in e.kernels)
    print(f"   kernel-launching ATen ops in one packed round: {sum(counts.values())} at {len(counts)} sites"
          + ("" if stacked else " (the profiler recorded no Python stacks: sites unknown)"))
    for (op, site), n in counts.most_common(top):
        # each op's kernels by count (one op may launch several kinds: a copy_ is a cast, an H2D or a D2H copy)
        ks = ", ".join(f"{c}x {k}" for k, c in kernels[(op, site)].most_common(2))
        print(f"   {n:6d}x {op:<22} {site[:60]:<60} {ks[:80]}")


def sync_round(run, top: int) -> None:
    """One round with torch.cuda's sync debug mode on: synchronising operations counted by their Python caller."""
    import collections
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message))
    print(f"   synchronising operations in one packed round: {sum(where.values())} at {len(where)} lines")
    for line, n in where.most_common(top):
        print(f"   {n:6d}x  {line}")


def profile_round(run, top: int) -> None:
    """One round under the torch profiler: device time by kernel name (launches, share) and the round's wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = run()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.device_time_total
            k[1] += 1
    busy = sum(t for t, _ in kernels.values())
    launches = sum(n for _, n in kernels.values())
    print(f"   profiled packed round: wall {wall * 1e3:.2f} ms (profiler on), device busy {busy / 1e3:.2f} ms in "
          f"{launches} kernels ({busy / 1e3 / (wall * 1e3):.0%} of the wall)")
    for name, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"   {t / 1e3:9.3f} ms {n:6d}x {t / busy:6.1%}  {name[:110]}")


if __name__ == "__main__":
    main()
