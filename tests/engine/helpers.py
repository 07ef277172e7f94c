"""Drivers shared by the engine tests: the single-request reference and a random-arrival loop."""

import functools
import random

import torch

from kestrel.config import ServerArgs
from kestrel.engine.core import EngineCore


def greedy_reference(model, prompt: list[int], n: int, stop_ids=()) -> list[int]:
    """The exactness oracle: full forward over the whole sequence for every new token, no cache."""
    return list(_greedy(model, tuple(prompt), n, tuple(stop_ids)))


@functools.lru_cache(maxsize=4096)
def _greedy(model, prompt: tuple, n: int, stop_ids: tuple) -> tuple:
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(model.reference_logits(seq, last_only=True)[-1].argmax())
        out.append(t)
        seq.append(t)
        if t in stop_ids:
            break
    return tuple(out)


def make_core(model, **kw) -> EngineCore:
    args = ServerArgs(model_path="k3-tiny", dtype="float64", skip_tokenizer_init=True, **kw)
    core = EngineCore(args, model=model)
    core.scheduler.check_invariants = True
    # every slot starts as NaN and every freed slot turns NaN: a restore of a slot nothing wrote fails loudly
    core.mm.poison = True
    for slot in range(core.mm.state.num_slots):
        core.mm.mem.run(("poison_slot", slot))
    return core


def drive(core: EngineCore, requests: list, seed: int = 0, max_steps: int = 100_000) -> dict:
    """Add requests at random steps, step until all finish; returns rid -> Req."""
    rng = random.Random(seed)
    queue, done, live = list(requests), {}, {}
    for _ in range(max_steps):
        while queue and (not live or rng.random() < 0.4):
            r = queue.pop(0)
            core.add_request(r)
            live[r.rid] = r
        for r in core.step():
            if r.finished:
                done[r.rid] = r
                live.pop(r.rid, None)
        if not queue and not live and not core.has_work():
            return done
    raise AssertionError("requests did not finish")


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 100, vocab: int = 4096) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens]
