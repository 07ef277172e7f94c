"""Where a batch-1 prefill's time goes (time to first token): the bundled model's prefill of one prompt at a time,
timed, then profiled (host functions by cProfile; on a GPU the kernels, launches and device-to-host waits by the
torch profiler).

    python benchmarks/prefill_profile.py [--device cuda --dtype bfloat16] [--lens 16,41,80,300] [--top 25]

Each prompt length is run once untimed (a new length may compile a kernel variant), then --repeats times timed
(requests of one new token: the prefill and its sample). The table printed last gives the wall ms per prefill by
length and, on a GPU, the device's busy ms in the same prefills.
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402


def prefill(core: EngineCore, prompt: list[int]) -> float:
    req = core.make_request(prompt, {"max_new_tokens": 1, "temperature": 0})
    core.add_request(req)
    sync = torch.cuda.synchronize if core.runner.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    while core.has_work():
        core.step()
    sync()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--lens", default="16,41,80,300")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--speculative", action="store_true", help="with the DSpark drafter (its prefill features)")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    kw = {"speculative_algorithm": "dspark"} if args.speculative else {}
    core = EngineCore(ServerArgs(model_path=args.model, dtype=args.dtype, device=args.device, max_running_requests=1,
                                 disable_radix_cache=True, **kw))
    vocab = core.model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    lens = [int(x) for x in args.lens.split(",")]
    prompts = {n: [torch.randint(3, vocab, (n,), generator=gen).tolist() for _ in range(args.repeats)] for n in lens}
    for n in lens:
        prefill(core, prompts[n][0])  # a new length's first run, untimed
    wall = {n: statistics.median(prefill(core, p) for p in prompts[n]) * 1e3 for n in lens}

    # host functions (cProfile slows Python more than kernels: an upper bound on the host's share)
    prof = cProfile.Profile()
    prof.enable()
    for n in lens:
        prefill(core, prompts[n][0])
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    print("== host functions by own time, one prefill of each length")
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])
    busy = {}
    if args.device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        n = lens[len(lens) // 2]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            prefill(core, prompts[n][1])
        events = p.key_averages()
        print(f"== one prefill of {n} tokens under the torch profiler: host-side calls by own CPU time")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
        print("== the same prefill's kernels by device time")
        print(events.table(sort_by="self_device_time_total", row_limit=args.top))
        for n in lens:
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                prefill(core, prompts[n][2])
            busy[n] = sum(e.self_device_time_total for e in p.key_averages()) / 1e3
    core.shutdown()
    print("\n| prompt tokens | prefill wall ms (median) | device busy ms |\n|---|---|---|")
    for n in lens:
        print(f"| {n} | {wall[n]:.2f} | {busy[n]:.2f} |" if n in busy else f"| {n} | {wall[n]:.2f} | - |")


if __name__ == "__main__":
    main()
