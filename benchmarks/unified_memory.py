"""Unified memory against static KV/state splits at one fixed byte budget, measured in the same run.

    python benchmarks/unified_memory.py [--model k3-tiny] [--budget-mb 4]

Workloads sweep from many short requests (state-bound) to a few long contexts (KV-bound). For each, the static
pools split the budget at KV fractions 0.1 ... 0.9, unified memory takes it whole; we report output tokens/s,
engine steps and the peak number of concurrently running requests. Then the decode step time of unified memory
against static pools of the same capacity. Radix cache off: the memory here is the running requests' own.
Capacity is judged by the peak number of requests running at once and the engine steps taken (deterministic);
tokens/s is printed too but is noisy on a shared CPU.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.mem.unified import BlockLayout  # noqa: E402

WORKLOADS = [  # (name, requests, prompt tokens, new tokens)
    ("many short", 96, 16, 8),
    ("short", 48, 64, 8),
    ("medium", 16, 256, 8),
    ("long", 6, 800, 8),
    ("few very long", 2, 2000, 8),
]


def run(args: ServerArgs, n: int, prompt: int, new: int, seed: int = 0) -> dict:
    core = EngineCore(args)
    g = torch.Generator().manual_seed(seed)
    reqs = [core.make_request(torch.randint(0, core.cfg.vocab_size, (prompt,), generator=g).tolist(),
                              {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}) for _ in range(n)]
    for r in reqs:
        core.add_request(r)
    steps, peak, start = 0, 0, time.perf_counter()
    while core.has_work():
        core.step()
        steps += 1
        peak = max(peak, sum(1 for r in core.scheduler.running if not r.finished))
    elapsed = time.perf_counter() - start
    aborted = sum(r.finish_reason["type"] == "abort" for r in reqs)
    core.shutdown()
    return {"tps": n * new / elapsed, "steps": steps, "peak": peak, "aborted": aborted}


def decode_step_ratio(model_name: str, page_size: int, batch: int = 16, ctx: int = 256, rounds: int = 7) -> float:
    """Model-level decode steps over the same requests laid out in static pools and in the unified pool,
    interleaved, median per side: the cost of the indirection and of strided views."""
    from kestrel.mem.pools import KVPool, Memory, StatePool
    from kestrel.mem.unified import UnifiedMemory, unified_bytes
    from kestrel.models.forward_batch import ForwardBatch, ForwardMode
    from kestrel.models.registry import resolve

    model = resolve(model_name, torch.float32, "cpu", progress=False).model
    cfg = model.cfg
    pages = batch * (-(-ctx // page_size)) + 1
    mems = {"static": Memory(KVPool(cfg, pages, page_size, torch.float32, "cpu"),
                             StatePool(cfg, batch + 1, torch.float32, "cpu")),
            # (one page and one slot of slack: the pool rounds its size down to whole pages)
            "unified": UnifiedMemory(cfg, unified_bytes(cfg, pages * page_size, batch + 2, page_size,
                                                        torch.float32), page_size, torch.float32, "cpu")}
    batches = {}
    for key, mem in mems.items():
        ids = mem.alloc_pages(pages - 1)
        slots = [mem.alloc_slot() for _ in range(batch)]
        phys = mem.page_phys(ids)
        per = len(phys) // batch
        table = torch.tensor([phys[i * per : (i + 1) * per] for i in range(batch)], dtype=torch.int32)
        pos = ctx - 1
        batches[key] = ForwardBatch(
            ForwardMode.DECODE, torch.randint(0, cfg.vocab_size, (batch,)), torch.full((batch,), pos), [1] * batch,
            [pos] * batch, mem=mem, page_table=table,
            out_cache_loc=table[:, pos // page_size].long() * page_size + pos % page_size,
            state_slots=torch.tensor([mem.slot_phys(s) for s in slots]), seq_lens_t=torch.full((batch,), ctx))
    times = {k: [] for k in mems}
    with torch.inference_mode():
        for _ in range(rounds):
            for key, fb in batches.items():
                model(fb)
                start = time.perf_counter()
                for _ in range(5):
                    model(fb)
                times[key].append(time.perf_counter() - start)
    return statistics.median(times["unified"]) / statistics.median(times["static"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-tiny")
    ap.add_argument("--budget-mb", type=float, default=1.5)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--ratios", default="0.1,0.3,0.5,0.7,0.9")
    args = ap.parse_args()
    base = dict(model_path=args.model, dtype="float32", skip_tokenizer_init=True, disable_radix_cache=True,
                page_size=args.page_size, chunked_prefill_size=4096, disable_overlap_schedule=True,
                max_running_requests=256)
    probe = EngineCore(ServerArgs(**base, max_total_tokens=64, max_state_slots=4))
    lay = BlockLayout.of(probe.cfg, args.page_size, torch.float32)
    probe.shutdown()
    budget = int(args.budget_mb * 2**20)
    print(f"budget {budget / 2**20:.1f} MiB: a state slot is {lay.slot_bytes} B, a KV page of {args.page_size} "
          f"tokens {lay.page_bytes} B ({lay.page_bytes / args.page_size:.0f} B/token)")

    def static(frac: float) -> ServerArgs:
        pages = max(2, int(budget * frac) // lay.page_bytes)
        slots = max(2, int(budget * (1 - frac)) // lay.slot_bytes)
        return ServerArgs(**base, max_total_tokens=(pages - 1) * args.page_size, max_state_slots=slots)

    # unified memory sized as "pages + 2 slots" of the same total bytes (it only uses the sum)
    pages = (budget - 2 * lay.slot_bytes) // lay.page_bytes
    unified = ServerArgs(**base, enable_unified_memory=True, max_total_tokens=(pages - 1) * args.page_size,
                         max_state_slots=2)
    ratios = [float(x) for x in args.ratios.split(",")]
    table = []
    for name, n, prompt, new in WORKLOADS:
        row = {"unified": run(unified, n, prompt, new)}
        for f in ratios:
            row[f] = run(static(f), n, prompt, new)
        # capacity first: the most requests running at once (deterministic), then fewer steps; tok/s is noisy here
        def score(f):
            return (row[f]["aborted"] == 0, row[f]["peak"], -row[f]["steps"])

        best = max(ratios, key=score)
        worst = min(ratios, key=score)
        table.append((name, row, best, worst))
        u = row["unified"]
        cells = "  ".join(f"{f}:{row[f]['peak']}/{row[f]['steps']}/{row[f]['tps']:.0f}"
                          f"{'/aborted ' + str(row[f]['aborted']) if row[f]['aborted'] else ''}" for f in ratios)
        print(f"{name:14s} unified peak {u['peak']:3d} steps {u['steps']:4d} {u['tps']:6.0f} tok/s | static "
              f"(peak/steps/tok/s) {cells}", flush=True)
    ratio = decode_step_ratio(args.model, args.page_size)
    print(f"\ndecode step time at batch 16, unified / static pools of the same capacity: {ratio:.3f}")
    print("\n| workload | unified: peak running / steps / tok/s | best static split | worst static split | "
          "unified peak / best peak |")
    print("|---|---|---|---|---|")

    def cell(r, f):
        extra = f", {r['aborted']} aborted" if r["aborted"] else ""
        return f"{r['peak']} / {r['steps']} / {r['tps']:.0f} ({f}{extra})"

    for name, row, best, worst in table:
        u = row["unified"]
        print(f"| {name} | {u['peak']} / {u['steps']} / {u['tps']:.0f} | {cell(row[best], best)} | "
              f"{cell(row[worst], worst)} | {u['peak'] / max(row[best]['peak'], 1):.2f} |")


if __name__ == "__main__":
    main()
