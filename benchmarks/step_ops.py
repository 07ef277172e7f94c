"""Which torch ops a batch-1 greedy speculative step launches on the GPU, with where in Kestrel each is called.

    PYTHONPATH=. python3 benchmarks/step_ops.py [--context-lookup on] [--steps 2]

Triton kernels launch under programmatic dependent launch (each may start before the one it follows ends); a torch
op's kernel launches plainly, so each one between two Triton kernels also breaks that chain. The step runs eagerly
(the step graph off) under the profiler with Python stacks; every ATen op that launched a kernel is listed once
with its kernels, its count a step and its innermost Kestrel call sites.
"""

import argparse
import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.host_profile import run  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context-lookup", default="on", choices=["auto", "on", "off"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    core = EngineCore(ServerArgs(dtype=args.dtype, device="cuda", max_running_requests=1,
                                 speculative_algorithm="dspark", speculative_context_lookup=args.context_lookup))
    vocab = core.model.cfg.vocab_size
    prompt = torch.randint(3, vocab, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    run(core, [prompt], 16)  # compiles and captures
    core.runner.spec.step_graphs = None  # the greedy step eagerly: its ops visible one by one
    req = core.make_request(prompt, {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True})
    core.add_request(req)
    for _ in range(3):  # the prefill, then eager steps (first-use work)
        core.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(args.steps):
            core.step()
        torch.cuda.synchronize()
    counts, kernels, sites = Counter(), {}, {}
    for e in prof.events():
        if e.device_type.name != "CPU" or not e.kernels or not e.name.startswith("aten::"):
            continue
        own = [f for f in (e.stack or []) if "/kestrel/" in f]
        key = (e.name, own[0] if own else "?")
        counts[key] += 1
        kernels[key] = sorted({k.name[:60] for k in e.kernels})
        sites[key] = own[:3]
    total = sum(counts.values()) / args.steps
    print(f"ATen ops that launched kernels: {total:.1f} a step")
    for key, n in counts.most_common():
        print(f"  {n / args.steps:4.1f}x {key[0]:<28} {' | '.join(kernels[key])}")
        for s in sites[key]:
            print(f"        {s}")
    core.shutdown()


if __name__ == "__main__":
    main()
