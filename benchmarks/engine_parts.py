"""Where an offline engine run's forward time goes on this machine, by forward mode and by model part.

    OMP_NUM_THREADS=2 python benchmarks/engine_parts.py [--model k3-small] [--concurrency 64] [--requests 128]
                                                        [--rounds 2] [--overlap]

Runs `offline_throughput.py`'s workload (random prompts, greedy, ignore_eos) through the engine with the model's
parts wrapped by wall-clock timers: the mixers (KDA, MLA), the FFNs (MoE, dense), the AttnRes settles, the LM head
and the embedding, and inside the KDA mixers their projections, output projection (with its gated norm), conv,
chunked recurrence, gates, L2 norms and decode op. Prefill forwards (EXTEND, decode rows mixed in included) and
decode forwards are summed apart. The KDA sub-parts are inside "kda"; "other" is the forwards' time outside every
timed part. Timers add a few microseconds a call; the parts are for proportions, not for ratios against the loop
(use offline_throughput.py for those).
"""

import argparse
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine  # noqa: E402
from kestrel.models import k3 as k3_module  # noqa: E402
from kestrel.models import kda as kda_module  # noqa: E402

PARTS = ("kda", "mla", "moe", "dense", "settle", "lm_head", "embed")
KDA_PARTS = ("proj", "oproj", "chunked", "PackedConvWindows", "kda_gate", "l2norm", "decode")


class PartClock:
    """Wall seconds per (forward mode, part name), from wrappers installed on instances and modules."""

    def __init__(self):
        self.sums = collections.defaultdict(float)
        self.mode = None

    def wrap(self, owner, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.sums[(self.mode, name)] += time.perf_counter() - start

        setattr(owner, attr, timed)

    def wrap_forward(self, model) -> None:
        inner = model.forward

        def forward(fb, *args, **kwargs):
            self.mode = "decode" if fb.mode.name == "DECODE" else "prefill"
            start = time.perf_counter()
            try:
                return inner(fb, *args, **kwargs)
            finally:
                self.sums[(self.mode, "total")] += time.perf_counter() - start

        model.forward = forward


def instrument(model) -> PartClock:
    clock = PartClock()
    clock.wrap_forward(model)
    for layer in model.model.layers:
        mixer = layer.self_attn
        clock.wrap(mixer, "forward", "kda" if layer.is_kda else "mla")
        if layer.is_kda:
            clock.wrap(mixer, "_project", "kda.proj")
            clock.wrap(mixer.o_proj, "forward_with", "kda.oproj")
        ffn = getattr(layer, "block_sparse_moe", None)
        clock.wrap(ffn if ffn is not None else layer.mlp, "forward", "moe" if ffn is not None else "dense")
    clock.wrap(model.lm_head, "forward", "lm_head")
    clock.wrap(k3_module, "attn_res_settle", "settle")
    clock.wrap(k3_module.norm_ops, "embed_rms_norm", "embed")
    for fn in ("chunked", "PackedConvWindows", "kda_gate", "l2norm", "decode"):
        clock.wrap(kda_module.kda_ops, fn, "kda." + fn)
    return clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--overlap", action="store_true", help="overlap scheduler on (default off: forwards on this thread)")
    args = ap.parse_args()
    engine = Engine(args.model, dtype="float32", skip_tokenizer_init=True, disable_radix_cache=True,
                    max_running_requests=args.concurrency, disable_overlap_schedule=not args.overlap)
    model = engine.core.model
    vocab = model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompts(k):
        return [torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(k)]

    params = {"max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=prompts(2), sampling_params={**params, "max_new_tokens": 4})  # warm-up
    clock = instrument(model)
    names = ("total",) + PARTS + tuple("kda." + p for p in KDA_PARTS)
    print(f"| round | wall s | tok/s | mode | {' | '.join(names)} | other |\n|" + "---|" * (len(names) + 5))
    for r in range(args.rounds):
        clock.sums.clear()
        start = time.perf_counter()
        engine.generate(input_ids=prompts(args.requests), sampling_params=params)
        wall = time.perf_counter() - start
        for mode in ("prefill", "decode"):
            ms = {n: clock.sums[(mode, n)] * 1e3 for n in names}
            other = ms["total"] - sum(ms[p] for p in PARTS)
            print(f"| {r} | {wall:.2f} | {args.requests * args.new_tokens / wall:.1f} | {mode} | "
                  f"{' | '.join(f'{ms[n]:.0f}' for n in names)} | {other:.0f} |")
    engine.shutdown()


if __name__ == "__main__":
    main()
