"""DSpark speculative decoding with ReplaySSM, all sides in one run.

    python benchmarks/speculative.py [--model DIR] [--drafter DIR] [--gamma 7] [--batches 1,4,16,64]

1. Acceptance: tokens per verify step (accepted drafts + the target's own token) on held-out code and arithmetic
   prompts, greedy.
2. Batch-1 decode tokens/s with and without speculation (same prompts, same outputs: checked).
3. Throughput against batch size for no speculation, verify-all and the planner.
4. Draft-window memory per request, ReplaySSM against the per-step snapshot baseline (measured on the model here;
   computed for k3-mini's head_dim-128 shapes), and the concurrent speculative requests a fixed budget holds.
"""

import argparse
import random
import statistics
import time

import torch

from kestrel.config import ServerArgs
from kestrel.engine.core import EngineCore
from kestrel.models.presets import preset_config
from kestrel.train import arith, corpus
from kestrel.tokenizer import Tokenizer


def code_prompts(tok: Tokenizer, n: int, rng: random.Random) -> list[list[int]]:
    """Openings of held-out stdlib files (never trained on)."""
    files = corpus.stdlib_files("heldout", True)
    rng.shuffle(files)
    out = []
    for _, text in files:
        ids = tok.encode(text)
        if len(ids) > 200:
            start = rng.randrange(0, len(ids) - 160)
            out.append(ids[start : start + 96])
        if len(out) == n:
            break
    return out


def arith_prompts(tok: Tokenizer, n: int) -> list[list[int]]:
    return [tok.encode(p.prompt) for p in arith.heldout_problems(n, seed=1)]


def make(args, **kw) -> EngineCore:
    a = ServerArgs(model_path=args.model, dtype="float32", disable_overlap_schedule=True, chunked_prefill_size=4096,
                   speculative_draft_model_path=args.drafter, speculative_num_draft_tokens=args.gamma, **kw)
    return EngineCore(a)


def generate(core: EngineCore, prompts, new: int):
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    reqs = [core.make_request(p, params) for p in prompts]
    for r in reqs:
        core.add_request(r)
    start = time.perf_counter()
    while core.has_work():
        core.step()
    return reqs, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target (default: the bundled k3-small)")
    ap.add_argument("--drafter", default=None, help="drafter (default: the bundled one)")
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,4,16,64")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    base = make(args)
    tok = base.tokenizer
    base.shutdown()
    sets = {"code": code_prompts(tok, args.prompts, rng), "arithmetic": arith_prompts(tok, args.prompts)}

    print("1. tokens per verify step (greedy, gamma = %d)" % args.gamma)
    for name, prompts in sets.items():
        core = make(args, speculative_algorithm="dspark")
        reqs, _ = generate(core, prompts, args.new_tokens)
        steps = sum(r.spec_verify_ct for r in reqs)
        per_step = (sum(r.spec_accepted for r in reqs) + steps) / steps
        print(f"   {name:10s} {per_step:.2f} tokens per verify step over {len(prompts)} prompts")
        core.shutdown()

    print("2. batch-1 decode")
    prompts = sets["code"][:6] + sets["arithmetic"][:6]
    times = {"plain": [], "dspark": []}
    outs = {}
    for _ in range(2):
        for key in times:
            kw = {"speculative_algorithm": "dspark"} if key == "dspark" else {}
            core = make(args, max_running_requests=1, **kw)
            reqs, elapsed = generate(core, prompts, args.new_tokens)
            times[key].append(len(prompts) * args.new_tokens / elapsed)
            outs[key] = [r.output_ids for r in reqs]
            core.shutdown()
    assert outs["plain"] == outs["dspark"], "speculation changed greedy output"
    plain, spec = statistics.median(times["plain"]), statistics.median(times["dspark"])
    print(f"   plain {plain:.1f} tok/s, DSpark {spec:.1f} tok/s: x{spec / plain:.2f}")

    print("3. throughput against batch size (output tok/s)")
    pool = sets["code"] + sets["arithmetic"]
    rows = []
    for b in map(int, args.batches.split(",")):
        prompts = [pool[i % len(pool)] for i in range(max(b, 4))]
        res = {}
        for key, kw in (("none", {}), ("verify-all", {"speculative_algorithm": "dspark", "disable_verify_planner": True}),
                        ("planned", {"speculative_algorithm": "dspark"})):
            core = make(args, max_running_requests=b, **kw)
            generate(core, prompts[:2], 8)  # warm-up, and the planner's one-off profile at this batch
            reqs, elapsed = generate(core, prompts, args.new_tokens // 2)
            res[key] = len(prompts) * (args.new_tokens // 2) / elapsed
            core.shutdown()
        rows.append((b, res))
        print(f"   batch {b:4d}: none {res['none']:8.1f}  verify-all {res['verify-all']:8.1f}  planned {res['planned']:8.1f}")

    print("4. draft-window memory per request")
    window = {}
    for rollback in ("replay", "snapshot"):
        core = make(args, speculative_algorithm="dspark", speculative_state_rollback=rollback,
                    disable_verify_planner=True)
        generate(core, sets["code"][:1], 8)
        window[rollback] = core.runner.spec.window_bytes
        slot = core.mm.state.bytes_per_slot()
        core.shutdown()
    print(f"   this model: ReplaySSM {window['replay'] / 1e3:.1f} KB, snapshots {window['snapshot'] / 1e3:.1f} KB "
          f"(x{window['snapshot'] / window['replay']:.1f}); a committed state slot is {slot / 1e3:.1f} KB")
    mini = preset_config("k3-mini")
    H, K, L = mini.linear_num_heads, mini.linear_head_dim, len(mini.kda_layer_ids)
    steps = args.gamma + 1
    # per KDA layer and step: k, g (K each), v (V), beta (1) in fp32 + the conv inputs (3HK) in bf16
    replay = L * steps * (H * (3 * K + 1) * 4 + 3 * H * K * 2)
    snap = L * steps * (H * K * K * 4 + 3 * H * K * 2)
    slot_mini = L * (H * K * K * 4 + 3 * 3 * H * K * 2)
    print(f"   k3-mini shapes: ReplaySSM {replay / 1e6:.2f} MB, snapshots {snap / 1e6:.1f} MB per request "
          f"(x{snap / replay:.0f}; {H * (3 * K + 1) * 4} B vs {H * K * K * 4 // 1024} KB per step per layer)")
    budget = 64e9
    per_req_replay, per_req_snap = slot_mini + replay, slot_mini + snap
    print(f"   at a 64 GB state budget: {budget / per_req_replay:.0f} concurrent speculative requests with ReplaySSM, "
          f"{budget / per_req_snap:.0f} with snapshots (x{per_req_snap / per_req_replay:.1f})")


if __name__ == "__main__":
    main()
