"""Prefix caching for recurrent state, each case against --disable-radix-cache in the same run.

    python benchmarks/prefix_cache.py [--model k3-tiny] [--state-slots 40]

Cases: (a) multi-turn chat (conversations sharing a system prompt, turns interleaved), (b) shared system prompt
(independent questions), (c) no reuse at all (random prompts), (d) identical repeated prompts. For each: prompt
tokens actually prefilled, hit rate (cached / prompt tokens), mean TTFT. Then (a) once more with the naive
"checkpoint every chunk" policy at the same state budget (--max-state-slots), for the hit-rate comparison.
"""

import argparse
import os
import random
import statistics

import sys
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.config import ServerArgs  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}


def run_wave(core: EngineCore, reqs, ttft: list[float]) -> None:
    """Submit requests together and step until they finish, recording their time to first token."""
    for r in reqs:
        core.add_request(r)
    pending = {r.rid for r in reqs}
    while pending:
        for r in core.step():
            if r.finished and r.rid in pending:
                pending.discard(r.rid)
                ttft.append(r.first_token_at - r.created_at)


def summary(core: EngineCore, ttft: list[float], outs) -> dict:
    s = core.scheduler.stats
    return {"prompt": s.prompt_tokens, "computed": s.computed_prompt_tokens, "cached": s.cached_tokens,
            "hit": s.cached_tokens / max(s.prompt_tokens, 1), "ttft_ms": 1e3 * statistics.mean(ttft), "outs": outs}


def run(core: EngineCore, batches: list[list[tuple[list[int], int]]]) -> dict:
    """Each inner list is submitted together (one wave), waves run one after the other."""
    ttft, outs = [], []
    for wave in batches:
        reqs = [core.make_request(p, {**GREEDY, "max_new_tokens": n}) for p, n in wave]
        run_wave(core, reqs, ttft)
        outs += [r.output_ids for r in reqs]
    return summary(core, ttft, outs)


def chat_workload(rng, vocab, convs=6, turns=5, system=200, user=(80, 150), reply=24):
    """Waves of one turn per conversation; each turn's prompt is the history plus a new user message.
    Replies are placeholders refreshed from the real outputs as the run goes (see run_chat)."""
    sys_prompt = [rng.randrange(vocab) for _ in range(system)]
    return sys_prompt, [[[rng.randrange(vocab) for _ in range(rng.randint(*user))] for _ in range(turns)]
                        for _ in range(convs)], reply


def run_chat(core, sys_prompt, users, reply) -> dict:
    histories = [list(sys_prompt) for _ in users]
    ttft = []
    for t in range(len(users[0])):
        reqs = []
        for c, msgs in enumerate(users):
            histories[c] += msgs[t]
            reqs.append(core.make_request(list(histories[c]), {**GREEDY, "max_new_tokens": reply}))
        run_wave(core, reqs, ttft)
        for c, r in enumerate(reqs):
            histories[c] += r.output_ids
    return summary(core, ttft, [h[len(sys_prompt):] for h in histories])


def make_core(model: str, **kw) -> EngineCore:
    kw.setdefault("chunked_prefill_size", 256)
    args = ServerArgs(model_path=model, dtype="float32", skip_tokenizer_init=True, disable_overlap_schedule=True, **kw)
    return EngineCore(args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-tiny")
    ap.add_argument("--state-slots", type=int, default=30, help="state budget of the chat case (a)")
    ap.add_argument("--chat-chunk", type=int, default=64, help="prefill chunk of the chat case (a)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    vocab = 4096
    rows = []

    def case(name, fn, repeats=1, **kw):
        # interleaved repeats, median TTFT: the two sides see the same machine noise
        ons, offs = [], []
        for _ in range(repeats):
            ons.append(fn(make_core(args.model, **kw)))
            offs.append(fn(make_core(args.model, disable_radix_cache=True, **kw)))
        on, off = ons[0], offs[0]
        on["ttft_ms"] = statistics.median(x["ttft_ms"] for x in ons)
        off["ttft_ms"] = statistics.median(x["ttft_ms"] for x in offs)
        assert on["outs"] == off["outs"], f"{name}: cache hits changed the output"
        rows.append((name, on, off))
        print(f"{name:34s} computed {on['computed']:6d} vs {off['computed']:6d}   hit {on['hit']:6.1%}   "
              f"TTFT {on['ttft_ms']:7.1f} ms vs {off['ttft_ms']:7.1f} ms", flush=True)
        return on

    rng = random.Random(args.seed)
    chat = chat_workload(rng, vocab)
    chat_kw = dict(max_state_slots=args.state_slots, chunked_prefill_size=args.chat_chunk)
    chat_on = case("(a) multi-turn chat", lambda c: run_chat(c, *chat), **chat_kw)
    system = [rng.randrange(vocab) for _ in range(400)]
    shared = [[(system + [rng.randrange(vocab) for _ in range(rng.randint(10, 40))], 16) for _ in range(8)]
              for _ in range(3)]
    case("(b) shared system prompt", lambda c: run(c, shared))
    fresh = [[([rng.randrange(vocab) for _ in range(rng.randint(100, 300))], 16) for _ in range(8)] for _ in range(3)]
    case("(c) no reuse", lambda c: run(c, fresh), repeats=5)
    repeat_prompt = [rng.randrange(vocab) for _ in range(700)]
    repeats = [[(repeat_prompt, 8)] for _ in range(4)]
    rep = case("(d) identical repeated prompt (700)", lambda c: run(c, repeats))
    # the repeats after the first: hit >= 1 - chunk / len
    later_hit = rep["cached"] / (rep["prompt"] - len(repeat_prompt))
    naive = run_chat(make_core(args.model, state_checkpoint_policy="every-chunk", **chat_kw), *chat)
    assert naive["outs"] == chat_on["outs"]
    print(f"\n(a) at {args.state_slots} state slots: sparse policy hit {chat_on['hit']:.1%} vs checkpoint-every-chunk "
          f"{naive['hit']:.1%}; repeated prompts hit {later_hit:.1%} (bound 1 - 64/700 = {1 - 64 / 700:.1%})")
    print("\n| case | prefill tokens computed (cache / no cache) | hit rate | TTFT ms (cache / no cache) |")
    print("|---|---|---|---|")
    for name, on, off in rows:
        print(f"| {name} | {on['computed']} / {off['computed']} | {on['hit']:.1%} | {on['ttft_ms']:.1f} / {off['ttft_ms']:.1f} |")
    print(f"| (a) checkpoint every chunk, same state budget | {naive['computed']} | {naive['hit']:.1%} | {naive['ttft_ms']:.1f} |")


if __name__ == "__main__":
    main()
