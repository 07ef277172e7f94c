"""A module setting ("knob") of the CPU serving path, each value against the first, paired prompt by prompt.

    OMP_NUM_THREADS=1 python benchmarks/cpu_knobs.py --knob kestrel.engine.model_runner.KMAJOR_CPU_WEIGHTS=False,True \
        [--knob another.module.NAME=a,b ...] [--knob args.speculative_context_lookup="'off'","'on'"] \
        [--kinds plain,dspark] [--prompts 6] [--rounds 4] [--new-tokens 64]

A knob named args.NAME is a ServerArgs field, given to the engines as they are built.

This machine's speed drifts by 10-20% between minutes, more than most CPU changes move a step, so whole runs taken
one after the other mislead. Here one engine per (kind, knob value) is alive at once (bundled k3-small, fp32, batch
1; "dspark" with the bundled drafter, gamma 7), and each held-out prompt (code and arithmetic, stopping at EOS) runs
on every value in turn, the order flipping every round. Per kind it prints the median over prompts and rounds of
each value's decode rate (tok/s from the first token to the last) divided by the first value's on the same prompt,
the median rates and the rate over all prompts (tokens / seconds, as speculative.py's section 2 reports it), and
with both kinds the DSpark / plain ratio at each value. Several --knob change together (variant i sets each knob
to its i-th value): a session's changes against their baselines at once. The knob is set before
each engine is built (settings read at start-up, like a weight layout) and before each of its runs (settings read
per step). Greedy outputs must not depend on the knob beyond rounding: the script reports prompts whose tokens
differ between values.
"""

import argparse
import ast
import importlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.speculative import decode_rate, generate, heldout_prompts, make  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--knob", required=True, action="append",
                    help="package.module.NAME=v1,v2,... (Python literals; v1: the baseline). Repeated: the knobs "
                         "change together, variant i setting each to its i-th value")
    ap.add_argument("--kinds", default="plain,dspark")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts of each set (code, arithmetic)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    knobs = []  # (module, NAME, values)
    for spec in args.knob:
        path, vals = spec.split("=", 1)
        mod_name, attr = path.rsplit(".", 1)
        mod = None if mod_name == "args" else importlib.import_module(mod_name)  # args.NAME: a ServerArgs field
        knobs.append((mod, attr, list(ast.literal_eval(f"[{vals}]"))))
    if len({len(k[2]) for k in knobs}) != 1:
        raise SystemExit("every --knob needs the same number of values")
    name = "+".join(k[1] for k in knobs)
    values = list(range(len(knobs[0][2])))  # variant indices; repr(v) keys the engines
    labels = {v: "/".join(repr(k[2][v]) for k in knobs) for v in values}

    def apply(v: int) -> None:
        """Every knob to its value of variant v."""
        for mod, attr, vals in knobs:
            if mod is not None:
                setattr(mod, attr, vals[v])

    kinds = args.kinds.split(",")
    margs = argparse.Namespace(model=None, drafter=None, gamma=7, dtype="float32", device="cpu", disable_pdl=False)
    engines = {}
    for v in values:
        apply(v)
        server = {attr: vals[v] for mod, attr, vals in knobs if mod is None}
        for kind in kinds:
            engines[(kind, repr(v))] = make(margs, max_running_requests=1, **server,
                                            **({"speculative_algorithm": "dspark"} if kind == "dspark" else {}))
    sets = heldout_prompts(next(iter(engines.values())).tokenizer, args.prompts)
    prompts = sets["code"] + sets["arithmetic"]
    for (kind, v), core in engines.items():  # warm-up: every prompt's shapes once
        apply(int(v))
        generate(core, prompts, 8)
    rates = {k: [] for k in engines}
    totals = {k: [0, 0.0] for k in engines}  # decode tokens, seconds: the aggregate rate speculative.py reports
    ratios = {(kind, repr(v)): [] for kind in kinds for v in values[1:]}
    differ = set()
    for rnd in range(args.rounds):
        order = values if rnd % 2 == 0 else values[::-1]
        for p, prompt in enumerate(prompts):
            for kind in kinds:
                got, outs = {}, {}
                for v in order:
                    apply(v)
                    reqs, _ = generate(engines[(kind, repr(v))], [prompt], args.new_tokens, ignore_eos=False)
                    got[repr(v)], outs[repr(v)] = decode_rate(reqs), reqs[0].output_ids
                    t = totals[(kind, repr(v))]
                    t[0] += len(reqs[0].output_ids) - 1
                    t[1] += reqs[0].finished_at - reqs[0].first_token_at
                    rates[(kind, repr(v))].append(got[repr(v)])
                for v in values[1:]:
                    ratios[(kind, repr(v))].append(got[repr(v)] / got[repr(values[0])])
                    if outs[repr(v)] != outs[repr(values[0])]:
                        differ.add((kind, p))
        print(f"round {rnd}: " + ", ".join(f"{k} {labels[int(v)]}: {statistics.median(r):.3f}x"
                                           for (k, v), r in ratios.items()), flush=True)
    apply(0)
    print(f"\n{name}, {len(prompts)} prompts x {args.rounds} rounds, paired per prompt (median of ratios against "
          f"{labels[0]}):")
    for (kind, v), r in ratios.items():
        q = statistics.quantiles(r, n=4)
        print(f"  {kind:6s} {labels[int(v)]}: {statistics.median(r):.3f}x (quartiles {q[0]:.3f}-{q[2]:.3f})")
    for (kind, v), r in rates.items():
        tok, sec = totals[(kind, v)]
        print(f"  {kind:6s} {labels[int(v)]}: median {statistics.median(r):.1f} tok/s a prompt, {tok / sec:.1f} tok/s "
              f"over all")
    if "plain" in kinds and "dspark" in kinds:
        for v in values:
            med = statistics.median(rates[("dspark", repr(v))]) / statistics.median(rates[("plain", repr(v))])
            (dt, ds), (pt, pss) = totals[("dspark", repr(v))], totals[("plain", repr(v))]
            print(f"  dspark / plain at {labels[v]}: x{med:.2f} (medians a prompt), x{dt / ds / (pt / pss):.2f} (over all)")
    print(f"  prompts whose tokens differ from the baseline's: {sorted(differ) or 'none'}")
    for core in engines.values():
        core.shutdown()


if __name__ == "__main__":
    main()
