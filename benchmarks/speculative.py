"""DSpark speculative decoding with ReplaySSM, all sides in one run.

    python benchmarks/speculative.py [--model DIR] [--drafter DIR] [--gamma 7] [--batches 1,4,16,64]
        [--device cuda --dtype bfloat16] [--stop-at-eos] [--out docs/img/speculative.json]

1. Acceptance: tokens per verify step (accepted drafts + the target's own token) on held-out code and arithmetic
   prompts, greedy.
2. Batch-1 decode tokens/s with and without speculation (same prompts, same outputs: checked), every request
   decoding --new-tokens past EOS, or with --stop-at-eos ending there as served.
3. Throughput against batch size for no speculation, verify-all and the planner.
4. Draft-window memory per request, ReplaySSM against the per-step snapshot baseline (measured on the model here;
   and for one KDA layer of k3-mini's head_dim-128 shapes in bf16, scaled by its layer count), and the concurrent
   speculative requests a fixed budget holds.
The figures land in a JSON file with a plot of throughput against batch size beside it.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel.config import ServerArgs  # noqa: E402
from kestrel.engine.core import EngineCore  # noqa: E402
from kestrel.models.presets import preset_config  # noqa: E402
from kestrel.ops.kda.reference import kda_verify  # noqa: E402
from kestrel.spec import distill_data  # noqa: E402
from kestrel.tokenizer import Tokenizer  # noqa: E402


def heldout_prompts(tok: Tokenizer, n: int) -> dict[str, list[list[int]]]:
    """The drafter's own held-out prompts (held-out stdlib files cut at a line; held-out arithmetic problems, some in
    the chat format), as `kestrel distill` measures them."""
    code = distill_data.code_prompts(tok, "heldout", n, seed=0)
    maths = distill_data.arith_prompts(tok, "heldout", n, seed=0, chat_fraction=0.3)
    return {"code": [p.ids for p in code], "arithmetic": [p.ids for p in maths]}


NEW_TOKENS_ACCEPTANCE = 128


def make(args, **kw) -> EngineCore:
    kw.setdefault("disable_overlap_schedule", True)
    kw.setdefault("speculative_context_lookup", getattr(args, "context_lookup", "auto"))
    a = ServerArgs(model_path=args.model, dtype=args.dtype, device=args.device, chunked_prefill_size=4096, disable_pdl=args.disable_pdl,
                   speculative_draft_model_path=args.drafter, speculative_num_draft_tokens=args.gamma, **kw)
    return EngineCore(a)


def generate(core: EngineCore, prompts, new: int, ignore_eos: bool = True):
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": ignore_eos}
    reqs = [core.make_request(p, params) for p in prompts]
    for r in reqs:
        core.add_request(r)
    start = time.perf_counter()
    while core.has_work():
        core.step()
    return reqs, time.perf_counter() - start


def prefill_gaps(reqs) -> list[float]:
    """Seconds from each request's last token to the next one's first, requests run one at a time (batch 1)."""
    done = sorted(reqs, key=lambda r: r.first_token_at)
    return [b.first_token_at - a.finished_at for a, b in zip(done, done[1:])]


class StallWatch:
    """Where a timed run's stalls come from: Python's cyclic garbage collections (count, total and longest) and
    the slowest engine step with its forward modes."""

    def __init__(self, core: EngineCore):
        self.core, self.gc_s, self.gc_n, self.gc_max, self.slowest = core, 0.0, 0, 0.0, (0.0, "")

    def _gc(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        elif hasattr(self, "_t"):
            dt = time.perf_counter() - self._t
            self.gc_s, self.gc_n, self.gc_max = self.gc_s + dt, self.gc_n + 1, max(self.gc_max, dt)

    def __enter__(self):
        import gc

        gc.callbacks.append(self._gc)
        step, run = self.core.step, self.core.runner.run
        modes = []

        def timed_run(b):
            modes.append(b.mode.name)
            return run(b)

        def timed_step():
            modes.clear()
            t = time.perf_counter()
            out = step()
            dt = time.perf_counter() - t
            if dt > self.slowest[0]:
                self.slowest = (dt, "+".join(modes) or "no forward")
            return out

        self.core.step, self.core.runner.run = timed_step, timed_run
        self._restore = (step, run)
        return self

    def __exit__(self, *exc):
        import gc

        gc.callbacks.remove(self._gc)
        self.core.step, self.core.runner.run = self._restore

    def __str__(self):
        return (f"gc {self.gc_n}x {self.gc_s:.3f} s (longest {self.gc_max:.3f}); slowest step "
                f"{self.slowest[0] * 1e3:.1f} ms ({self.slowest[1]})")


def alloc_retries(device: str) -> int:
    """cudaMalloc retries after freeing the caching allocator's blocks (each a device-wide synchronisation)."""
    return torch.cuda.memory_stats().get("num_alloc_retries", 0) if device == "cuda" else 0


def decode_rate(reqs) -> float:
    """Decode tok/s from each request's first token to its last (prefill excluded: at batch 1 a prompt's prefill
    weighs on DSpark's few steps far more than on plain decoding's many)."""
    return sum(len(r.output_ids) - 1 for r in reqs) / sum(r.finished_at - r.first_token_at for r in reqs)


def step_phases(args, prompts) -> dict[str, float]:
    """Where a batch-1 speculative step's wall time goes (draft, verify, accept, fold; the worker's profiler ranges),
    and the plain decode step beside it, in ms."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for key in ("plain", "dspark"):
        core = make(args, max_running_requests=1, **({"speculative_algorithm": "dspark"} if key == "dspark" else {}))
        generate(core, prompts, 8)  # warm-up (every prompt's prefill shape)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=acts) as prof:
            reqs, elapsed = generate(core, prompts, args.new_tokens)
        core.shutdown()
        if key == "plain":
            out["plain token"] = elapsed / (len(prompts) * args.new_tokens) * 1e3
            continue
        steps = sum(r.spec_verify_ct for r in reqs)
        for e in prof.key_averages():
            if e.key.startswith("spec."):  # the CPU range (its GPU annotation twin carries no CPU time)
                out[e.key[5:]] = max(out.get(e.key[5:], 0.0), e.cpu_time_total / 1e3 / steps)
                # and the GPU twin: how long the range's kernels kept the device busy
                gpu = getattr(e, "device_time_total", 0.0) / 1e3 / steps
                if gpu > 0:
                    out["gpu " + e.key[5:]] = max(out.get("gpu " + e.key[5:], 0.0), gpu)
        out["whole step"] = elapsed / steps * 1e3
        out["tokens per step"] = sum(len(r.output_ids) for r in reqs) / steps
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target (default: the bundled k3-small)")
    ap.add_argument("--drafter", default=None, help="drafter (default: the bundled one)")
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--sections", default="1,2,3,4", help="which of the four parts to run")
    ap.add_argument("--rounds", type=int, default=1, help="section 3: rounds of every side, turn about (medians)")
    ap.add_argument("--decode-prompts", type=int, default=6,
                    help="section 2: prompts of each held-out set (code, arithmetic) served one at a time; more give "
                         "a longer timed decode (a few tens of ms a side at 6 on the H200), at most --prompts")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="section 2: requests stop at EOS, as served (default: every request decodes --new-tokens, "
                         "past EOS, the figures of earlier runs)")
    ap.add_argument("--launch-steps", default="1",
                    help="section 2: also dspark+overlap with launches of these many verify steps at most, beside "
                         "the engine's default (2 on CUDA with graphs, else 1; comma-separated, the default's own value "
                         "skipped)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on a CPU (both sides)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--disable-pdl", action="store_true", help="the engine's --disable-pdl (GPU)")
    ap.add_argument("--context-lookup", default="auto", choices=("auto", "on", "off"),
                    help="the engine's --speculative-context-lookup (auto: the engine's choice, on)")
    ap.add_argument("--out", default=None, help="JSON results (none written without it); the plot lands beside it")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    report = {"args": vars(args)}
    base = make(args)
    tok = base.tokenizer
    base.shutdown()
    sets = heldout_prompts(tok, args.prompts)
    sections = set(map(int, args.sections.split(",")))
    rows = []

    print("1. tokens per verify step (greedy, gamma = %d, up to %d new tokens, stopping at EOS)"
          % (args.gamma, NEW_TOKENS_ACCEPTANCE))
    # the drafter alone, then (where the engine would use them) with context lookups where it doubts itself
    lookups = ["off"] + (["on"] if ServerArgs(device=args.device, speculative_context_lookup=args.context_lookup)
                         .context_lookup else [])
    for lookup in (lookups if 1 in sections else ()):
        for name, prompts in sets.items():
            # every draft verified (the planner would cut positions; this measures the drafter)
            core = make(args, speculative_algorithm="dspark", disable_verify_planner=True,
                        speculative_context_lookup=lookup)
            reqs, _ = generate(core, prompts, NEW_TOKENS_ACCEPTANCE, ignore_eos=False)
            steps = sum(r.spec_verify_ct for r in reqs)
            per_step = (sum(r.spec_accepted for r in reqs) + steps) / steps
            label = "drafter alone" if lookup == "off" else "with context lookup"
            print(f"   {name:10s} {per_step:.2f} tokens per verify step over {len(prompts)} prompts ({label})")
            report[f"tokens_per_verify_{name}" + ("" if lookup == "off" else "_lookup")] = per_step
            core.shutdown()

    if 2 in sections:
        print("2. batch-1 decode")
        k = args.decode_prompts
        prompts = sets["code"][:k] + sets["arithmetic"][:k]
        # both ways with and without the overlap scheduler (the engine's default; with it, a speculative step is
        # launched chained onto the one in flight); decode tok/s from first to last token, and end to end with the
        # prefill
        sides = {"plain": {}, "plain+overlap": {"disable_overlap_schedule": False},
                 "dspark": {"speculative_algorithm": "dspark"},
                 "dspark+overlap": {"speculative_algorithm": "dspark", "disable_overlap_schedule": False}}
        # the engine's default launches of verify steps (2 on CUDA with graphs, else 1) against the others asked for
        auto = ServerArgs(device=args.device, speculative_algorithm="dspark").launch_steps
        for k in filter(None, args.launch_steps.split(",")):
            if int(k) != auto:
                sides[f"dspark+overlap/{k}"] = {**sides["dspark+overlap"], "speculative_launch_steps": int(k)}
        times = {key: [] for key in sides}
        e2e = {key: [] for key in sides}
        gaps = {key: [] for key in sides}
        split = {key: [] for key in sides}
        per_step = {key: [] for key in sides if "dspark" in key}
        outs = {}
        for _ in range(2):
            for key, kw in sides.items():
                core = make(args, max_running_requests=1, **kw)
                # warm-up over every prompt: a prefill of a new length may compile a kernel variant (Triton
                # specialises integer arguments), which must not land in either side's timed run
                generate(core, prompts, 8)
                retries = alloc_retries(args.device)
                with StallWatch(core) as watch:
                    reqs, elapsed = generate(core, prompts, args.new_tokens, ignore_eos=not args.stop_at_eos)
                retries = alloc_retries(args.device) - retries
                times[key].append(decode_rate(reqs))
                e2e[key].append(sum(len(r.output_ids) for r in reqs) / elapsed)
                if "dspark" in key:
                    steps = sum(r.spec_verify_ct for r in reqs)
                    per_step[key].append((sum(r.spec_accepted for r in reqs) + steps) / steps)
                gaps[key].append(statistics.median(prefill_gaps(reqs)) * 1e3)
                # where the end-to-end time went: decoding, the gaps between requests (the largest apart), and the
                # rest (the first prefill, anything after the last token)
                dec = sum(r.finished_at - r.first_token_at for r in reqs)
                between = prefill_gaps(reqs)
                split[key].append(f"{elapsed:.3f} s = decode {dec:.3f} + gaps {sum(between):.3f} (largest "
                                  f"{max(between, default=0.0):.3f}) + rest {elapsed - dec - sum(between):.3f}"
                                  + (f"; caching-allocator retries {retries}" if args.device == "cuda" else "")
                                  + f"; {watch}")
                outs[key] = [r.output_ids for r in reqs]
                core.shutdown()
        for key in (k for k in sides if "dspark" in k):
            if args.device == "cpu":
                assert outs["plain"] == outs[key], f"speculation ({key}) changed greedy output"
            else:  # verify and decode kernels round differently: report how much agrees (the GPU test bounds flips)
                same = sum(a == b for a, b in zip(outs["plain"], outs[key]))
                print(f"   {key}: greedy outputs identical to plain decoding for {same} of {len(prompts)} prompts "
                      "(kernel rounding flips the rest)")
        med = {k: statistics.median(v) for k, v in times.items()}
        # each side at its better scheduler setting
        plain, spec = max(med["plain"], med["plain+overlap"]), max(med["dspark"], med["dspark+overlap"])
        rounds = "; ".join(f"{k} " + ", ".join(f"{t:.1f}" for t in v) for k, v in times.items())
        print(f"   decode: plain {plain:.1f} tok/s, DSpark {spec:.1f} tok/s: x{spec / plain:.2f} (each at its faster "
              f"setting: plain {med['plain']:.1f}, plain+overlap {med['plain+overlap']:.1f}, dspark "
              f"{med['dspark']:.1f}, dspark+overlap {med['dspark+overlap']:.1f}) (rounds: {rounds})")
        for key in (k for k in med if k.startswith("dspark+overlap/")):
            print(f"   at most {key.split('/')[1]} verify steps a launch: {key} {med[key]:.1f} tok/s, x"
                  f"{med[key] / plain:.2f} of plain; the engine's default (dspark+overlap) "
                  f"{med['dspark+overlap'] / med[key]:.3f}x of it")
        print("   tokens per verify step: " + "; ".join(f"{k} " + ", ".join(f"{t:.2f}" for t in v)
                                                      for k, v in per_step.items())
              + (" (stopping at EOS)" if args.stop_at_eos else f" ({args.new_tokens} tokens a request, past EOS)"))
        e2e_med = {k: statistics.median(v) for k, v in e2e.items()}
        e2e_ratio = max(e2e_med["dspark"], e2e_med["dspark+overlap"]) / max(e2e_med["plain"], e2e_med["plain+overlap"])
        print("   end to end (prefill included): " + ", ".join(f"{k} {v:.1f}" for k, v in e2e_med.items())
              + f" tok/s: x{e2e_ratio:.2f} (rounds: "
              + "; ".join(f"{k} " + ", ".join(f"{t:.1f}" for t in v) for k, v in e2e.items()) + ")")
        print("   from one request's last token to the next one's first (its prefill), median ms: "
              + "; ".join(f"{k} " + ", ".join(f"{t:.1f}" for t in v) for k, v in gaps.items()))
        for key, v in split.items():
            print(f"   {key} timed runs: " + "; ".join(v))
        report["batch1"] = {"plain": plain, "dspark": spec, "speedup": spec / plain, "sides": med,
                            "stop_at_eos": args.stop_at_eos, "tokens_per_step": per_step,
                            "end_to_end": e2e_med}
        report["batch1_phases_ms"] = phases = step_phases(args, prompts[:4])
        print("   one speculative step at batch 1, wall ms per verify step: "
              + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))

    if 3 in sections:
        print("3. throughput against batch size (output tok/s)")
        pool = sets["code"] + sets["arithmetic"]
        batches = list(map(int, args.batches.split(",")))
        # two engines for the whole sweep (start-up, graph capture and the planner's profile are paid once, before
        # any clock): the batch is the scheduler's admission cap; verify-all and planned are the same speculative
        # engine with its planner switched off and on
        plain = make(args, max_running_requests=max(batches))
        spec = make(args, max_running_requests=max(batches), speculative_algorithm="dspark")
        w = spec.runner.spec
        w.prepare(max(batches))
        for bk in sorted(w.profile):
            full = {L: t for L, _, t in w.profile[bk]}
            print(f"   planner at bucket {bk}: whole blocks {full[max(full)] * 1e3:.2f} ms, every block cut to one "
                  f"token {full[min(full)] * 1e3:.2f} ms, planning costs {w.plan_cost.get(bk, 0) * 1e3:.2f} ms a step "
                  f"-> {'plans' if w._worth_planning(bk) else 'never plans (verifies every draft)'}", flush=True)
        sides = ("none", "verify-all", "planned")
        for b in batches:
            prompts = [pool[i % len(pool)] for i in range(max(b, 4))]
            runs = {key: [] for key in sides}
            for rnd, key in ((r, k) for r in range(args.rounds) for k in sides):  # the sides turn about
                core = plain if key == "none" else spec
                core.scheduler.max_running = b
                if core is spec:
                    spec.runner.spec.use_planner = key == "planned"
                generate(core, prompts, 16)  # warm-up at the full batch
                if core is spec:
                    spec.runner.spec.step_stats.clear()
                reqs, elapsed = generate(core, prompts, args.new_tokens // 2)
                runs[key].append(len(prompts) * (args.new_tokens // 2) / elapsed)
                if core is spec and rnd == args.rounds - 1:  # where the last round's speculative steps went
                    for (bk, pruned), (n, reqs_, toks, wall, ver) in sorted(spec.runner.spec.step_stats.items()):
                        print(f"      {key} bucket {bk} {'pruned' if pruned else 'whole '}: {n} steps, "
                              f"{reqs_ / n:.1f} requests and {toks / n:.1f} tokens a step, step {wall / n * 1e3:.2f} ms "
                              f"(verify {ver / n * 1e3:.2f}), elapsed {elapsed:.2f} s", flush=True)
                    if key == "planned":
                        g = spec.runner.spec.guard
                        print("      guard rates (tok/s, planned / whole): "
                              + ", ".join(f"{bk}: {r.get(True, 0):.0f} / {r.get(False, 0):.0f}"
                                          for bk, r in sorted(g.rate.items())), flush=True)
            res = {k: statistics.median(v) for k, v in runs.items()}
            rows.append((b, res))
            report.setdefault("throughput", {})[b] = res
            report.setdefault("throughput_rounds", {})[b] = runs
            print(f"   batch {b:4d}: " + "  ".join(f"{k} {res[k]:8.1f}" for k in sides)
                  + ("  (medians of rounds: " + "; ".join(f"{k} " + "/".join(f"{v:.0f}" for v in runs[k])
                                                        for k in sides) + ")" if args.rounds > 1 else ""), flush=True)
        plain.shutdown()
        spec.shutdown()

    if 4 in sections:
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
        per_layer = {k: mini_layer_window(mini, args.gamma + 1, k == "snapshot") for k in ("replay", "snapshot")}
        L = len(mini.kda_layer_ids)
        H, K = mini.linear_num_heads, mini.linear_head_dim
        replay, snap = L * per_layer["replay"], L * per_layer["snapshot"]
        slot_mini = L * (H * K * K * 4 + 3 * (mini.short_conv_kernel_size - 1) * H * K * 2)
        steps = args.gamma + 1
        print(f"   k3-mini shapes (bf16, measured on one layer x {L}): ReplaySSM {replay / 1e6:.2f} MB, snapshots "
              f"{snap / 1e6:.1f} MB per request (x{snap / replay:.1f}; {per_layer['replay'] / steps / H:.0f} B vs "
              f"{per_layer['snapshot'] / steps / H / 1024:.1f} KB per step per head, conv inputs included)")
        budget = 64e9
        per_req_replay, per_req_snap = slot_mini + replay, slot_mini + snap
        print(f"   at a 64 GB state budget: {budget / per_req_replay:.0f} concurrent speculative requests with ReplaySSM, "
              f"{budget / per_req_snap:.0f} with snapshots (x{per_req_snap / per_req_replay:.1f})")
        report["window"] = {"this_model": window, "k3_mini": {"replay": replay, "snapshot": snap},
                            "concurrent_64GB": {"replay": budget / per_req_replay, "snapshot": budget / per_req_snap}}
    if args.out:
        save(report, rows, Path(args.out))


def mini_layer_window(cfg, steps: int, snapshot: bool) -> int:
    """Draft-window bytes of one k3-mini KDA layer for one request: a real kda_verify over random bf16 inputs."""
    H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    C = 3 * H * K
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(1, steps, C, generator=g).to(bf)
    raw = torch.randn(1, steps, H, K, generator=g).to(bf)
    beta = torch.rand(1, steps, H, generator=g).to(bf)
    conv_w = torch.randn(C, W, generator=g).to(bf)
    conv_state = torch.zeros(1, W - 1, C, dtype=bf)
    ssm = torch.zeros(1, H, K, K)
    _, rec = kda_verify(x, raw, beta, [steps], conv_w, conv_state, ssm, torch.tensor([0]), torch.zeros(H),
                        torch.zeros(C // 3), -5.0, K**-0.5, snapshot_states=snapshot)
    return rec.nbytes()


def save(report: dict, rows, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    batches = [b for b, _ in rows]
    for key in ("none", "verify-all", "planned"):
        ax.plot(batches, [r[key] for _, r in rows], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (running requests)")
    ax.set_ylabel("output tokens/s")
    a = report["args"]
    ax.set_title(f"DSpark (gamma {a['gamma']}) on {a['device']}, {a['dtype']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    print(f"wrote {out} and {png}")


if __name__ == "__main__":
    main()
