"""Forward throughput of the presets on this machine's CPU (random weights; the bundled model for k3-small too).

    python benchmarks/cpu_forward.py [--threads 1]

Prefill: one 512-token sequence, full forward. Decode: batch 1 and batch 16, one token per step through the
paged KV / state-slot path (the reference ops), after a 64-token prompt.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.mem.pools import KVPool, Memory, StatePool  # noqa: E402
from kestrel.models.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from kestrel.models.k3 import K3ForCausalLM  # noqa: E402
from kestrel.models.presets import init_random, preset_config  # noqa: E402
from kestrel.models.registry import BUNDLED, bundled_available  # noqa: E402
from kestrel.models.loader import load_model  # noqa: E402


def prefill_tps(model, n=512, reps=3) -> float:
    ids = torch.randint(0, model.cfg.vocab_size, (n,)).tolist()
    model.reference_logits(ids, last_only=True)
    start = time.perf_counter()
    for _ in range(reps):
        model.reference_logits(ids, last_only=True)
    return n * reps / (time.perf_counter() - start)


def decode_tps(model, batch: int, steps=32, prompt=64) -> float:
    cfg = model.cfg
    mem = Memory(KVPool(cfg, batch * (prompt + steps) + 1, 1, model.dtype, "cpu"),
                 StatePool(cfg, batch + 1, model.dtype, "cpu"))
    width = prompt + steps
    table = torch.arange(1, batch * width + 1, dtype=torch.int32).view(batch, width)
    slots = torch.arange(1, batch + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch * prompt,))
    with torch.inference_mode():
        fb = ForwardBatch(ForwardMode.EXTEND, ids, torch.arange(prompt).repeat(batch), [prompt] * batch, [0] * batch,
                          mem=mem, page_table=table, out_cache_loc=table[:, :prompt].reshape(-1).long(),
                          state_slots=slots, logits_indices=torch.arange(batch) * prompt + prompt - 1)
        tok = model(fb).logits.argmax(-1)
        start = time.perf_counter()
        for i in range(prompt, prompt + steps):
            fb = ForwardBatch(ForwardMode.DECODE, tok, torch.full((batch,), i), [1] * batch, [i] * batch, mem=mem,
                              page_table=table, out_cache_loc=table[:, i].long(), state_slots=slots,
                              seq_lens_t=torch.full((batch,), i + 1))
            tok = model(fb).logits.argmax(-1)
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = []
    for name in ("k3-tiny", "k3-small"):
        m = K3ForCausalLM(preset_config(name))
        init_random(m, 0)
        models.append((f"{name} (random)", m.eval()))
    if bundled_available():
        models.append(("k3-small (bundled)", load_model(BUNDLED, progress=False)))
    print(f"| model | prefill tok/s (512) | decode tok/s batch 1 | decode tok/s batch 16 |  ({args.threads} thread)")
    print("|---|---|---|---|")
    for name, m in models:
        print(f"| {name} | {prefill_tps(m):.0f} | {decode_tps(m, 1):.1f} | {decode_tps(m, 16):.1f} |", flush=True)


if __name__ == "__main__":
    main()
