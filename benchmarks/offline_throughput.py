"""Offline throughput of the engine against a plain one-request-at-a-time generate loop, in one run.

    python benchmarks/offline_throughput.py [--models k3-tiny,k3-small] [--concurrency 1,8,64]
                                            [--num-continuous-decode-steps 1,8] [--overlap on,off] [--dp-size 1,2]

The loop is the same model and memory pools driven directly (prefill, then one decode forward per token, greedy),
with no scheduler: at concurrency 1 the engine must be no slower (the scheduler costs ~nothing), at 64 it should
be >= 20x faster (batching). Each concurrency runs --repeats engine runs, each between two loop runs (its ratio
is against their mean), and reports the medians. Output tokens per second; prompts are random token ids. Each
side's wall time outside the model's forwards (`ForwardClock`) is reported per output token too: the host's own
cost, which the forwards' drift between runs does not blur.

--dp-size 2 runs the engine as two data-parallel replicas (core processes that split the torch threads), each
with max_running_requests = concurrency / 2, so that the concurrency is the same (a size that does not divide the
concurrency is skipped there); the loop stays one process with every thread. The forwards of replicas are not timed (their column reads "-").

--matmul-bound profiles one more engine run at each concurrency and sums the self time of its matrix products
(`aten::mm`, `bmm`, `addmm`, `baddbmm`, ...) per output token: the loop's time a token over it is the ratio the
engine could reach on this machine if everything but its matrix products were free (a ceiling, measured in the
same run as both sides).
"""

import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kestrel import Engine  # noqa: E402
from kestrel.mem.pools import KVPool, Memory, StatePool  # noqa: E402
from kestrel.models.forward_batch import ForwardBatch, ForwardMode  # noqa: E402


def plain_loop(model, prompts: list[list[int]], new_tokens: int) -> float:
    """Generate for each prompt in turn; returns output tokens per second."""
    cfg, dt = model.cfg, model.dtype
    max_len = max(map(len, prompts)) + new_tokens
    mem = Memory(KVPool(cfg, max_len + 1, 1, dt, "cpu"), StatePool(cfg, 2, dt, "cpu"))
    table = torch.arange(1, max_len + 1, dtype=torch.int32).view(1, -1)
    slot = torch.tensor([1])
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            n = len(prompt)
            fb = ForwardBatch(ForwardMode.EXTEND, torch.tensor(prompt), torch.arange(n), [n], [0], mem=mem,
                              page_table=table, out_cache_loc=torch.arange(1, n + 1), state_slots=slot,
                              logits_indices=torch.tensor([n - 1]))
            tok = model(fb).logits.argmax(-1)
            for i in range(n, n + new_tokens - 1):
                fb = ForwardBatch(ForwardMode.DECODE, tok, torch.tensor([i]), [1], [i], mem=mem, page_table=table,
                                  out_cache_loc=torch.tensor([i + 1]), state_slots=slot,
                                  seq_lens_t=torch.tensor([i + 1]))
                tok = model(fb).logits.argmax(-1)
    return len(prompts) * new_tokens / (time.perf_counter() - start)


class ForwardClock:
    """Seconds spent inside a model's forwards (the instance's `forward` wrapped), so that each side's time outside
    them (the scheduler's and the runner's host work, against the loop's own) is measured apart from the forwards,
    whose time drifts with the machine."""

    def __init__(self, model):
        self.seconds, inner = 0.0, model.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        model.forward = timed

    def outside(self, fn, *args) -> tuple[float, float]:
        """(fn's result: tokens per second, seconds outside the forwards per output token)."""
        before, start = self.seconds, time.perf_counter()
        tps = fn(*args)
        elapsed = time.perf_counter() - start
        return tps, (elapsed - (self.seconds - before)) / (tps * elapsed)


def engine_run(engine: Engine, prompts, new_tokens: int) -> float:
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    assert all(len(o["output_ids"]) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_", "aten::baddbmm", "aten::baddbmm_", "aten::mv",
              "aten::addmv", "aten::addmv_", "aten::addbmm", "aten::addbmm_", "aten::mkldnn_linear", "aten::_mkl_linear")


def matmul_ms_per_token(engine: Engine, prompts, new_tokens: int) -> float:
    """Self time of the matrix products of one engine run (profiled, every thread), in ms per output token."""
    every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)  # the overlap's forward thread
    with profile(activities=[ProfilerActivity.CPU], experimental_config=every_thread) as prof:
        engine_run(engine, prompts, new_tokens)
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    assert any(k in ops for k in MATMUL_OPS), "the profiler recorded no matrix products"
    return sum(ops.get(k, 0.0) for k in MATMUL_OPS) / 1e3 / (len(prompts) * new_tokens)


def _ms(x: float) -> str:
    return "-" if x != x else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="k3-tiny,k3-small")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--loop-requests", type=int, default=8)
    ap.add_argument("--chunked-prefill-size", type=int, default=None,
                    help="the engine's prefill token budget a step (default: the engine's own default)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="engine runs per concurrency, each between two loop runs; medians reported (this machine's "
                         "speed drifts by 10-20%% between minutes, so a loop measured once up front misleads)")
    ap.add_argument("--disable-overlap-schedule", action="store_true",
                    help="the engine steps on the calling thread (on a CPU the forward thread otherwise competes with "
                         "torch's own threads for the cores); the same as --overlap off")
    ap.add_argument("--overlap", default=None,
                    help="comma-separated on/off: one engine per value (times each decode-steps value), each run "
                         "between loop runs, so the overlap scheduler is compared with serial scheduling in one run")
    ap.add_argument("--num-continuous-decode-steps", default="1",
                    help="comma-separated: one engine per value, each run between loop runs (decode steps a launch "
                         "runs before the scheduler sees their tokens)")
    ap.add_argument("--disable-host-malloc-tuning", action="store_true",
                    help="the engine leaves glibc's malloc thresholds as they are (the settings are process-wide: "
                         "compare the two in separate runs)")
    ap.add_argument("--dp-size", default="1",
                    help="comma-separated: one engine per value (data-parallel replicas), each run between loop runs")
    ap.add_argument("--matmul-bound", action="store_true",
                    help="also report the ratio the engine would reach if only its matrix products cost time")
    args = ap.parse_args()
    bounds = []
    rows = []
    for name in args.models.split(","):
        engine_args = dict(dtype="float32", skip_tokenizer_init=True, disable_radix_cache=True)
        if args.chunked_prefill_size:
            engine_args["chunked_prefill_size"] = args.chunked_prefill_size
        if args.disable_host_malloc_tuning:
            engine_args["disable_host_malloc_tuning"] = True
        gen = torch.Generator().manual_seed(0)

        def prompts(k, vocab):
            return [torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(k)]

        overlaps = (args.overlap or ("off" if args.disable_overlap_schedule else "on")).split(",")
        assert set(overlaps) <= {"on", "off"}, f"--overlap takes on and off, not {args.overlap}"
        variants = [(int(s), o, int(dp)) for s in args.num_continuous_decode_steps.split(",") for o in overlaps
                    for dp in args.dp_size.split(",")]
        for c in map(int, args.concurrency.split(",")):
            # replicas of max_running_requests = c / dp each, so that the concurrency stays c
            fits = [v for v in variants if c % v[2] == 0]
            for s, o, dp in sorted(set(variants) - set(fits)):
                print(f"{name} concurrency {c}: skipping dp size {dp}, which does not divide it", flush=True)
            if not fits:
                continue
            engines = [Engine(name, **engine_args, max_running_requests=c // dp, num_continuous_decode_steps=s,
                              disable_overlap_schedule=o == "off", dp_size=dp) for s, o, dp in fits]
            # the loop drives a one-process engine's model (its runner set the weights' layout and the heap)
            own = next((e for e in engines if e.core is not None), None)
            loop_engine = own or Engine(name, **engine_args, max_running_requests=c)
            model = loop_engine.core.model
            vocab = model.cfg.vocab_size
            clock = ForwardClock(model)
            clocks = [clock if e is own else ForwardClock(e.core.model) if e.core else None for e in engines]
            for engine in engines:
                # warm-up at the measured batch's shapes (c prompts: its prefill chunks, its decode batch), so that no
                # side pays its first large allocations inside a measured run; the loop likewise below
                engine_run(engine, prompts(c, vocab), 4)
            plain_loop(model, prompts(1, vocab), 4)
            # loop, engine, loop, engine, ..., loop: each engine run against the mean of the loop runs either side
            # of it, so that a machine speeding up or slowing down over the run biases no ratio
            loops = [clock.outside(plain_loop, model, prompts(args.loop_requests, vocab), args.new_tokens)]
            pairs = [[] for _ in engines]
            for _ in range(args.repeats):
                for engine, timer, kept in zip(engines, clocks, pairs):
                    batch = prompts(max(c * 2, args.loop_requests), vocab)
                    if timer is None:
                        tps, host = engine_run(engine, batch, args.new_tokens), float("nan")
                    else:
                        tps, host = timer.outside(engine_run, engine, batch, args.new_tokens)
                    loops.append(clock.outside(plain_loop, model, prompts(args.loop_requests, vocab),
                                               args.new_tokens))
                    loop, loop_host = ((a + b) / 2 for a, b in zip(loops[-2], loops[-1]))
                    kept.append((tps, loop, tps / loop, host * 1e3, loop_host * 1e3))
            if args.matmul_bound:
                assert engines[0].core is not None, "--matmul-bound profiles a one-process engine (--dp-size 1 first)"
                mm = matmul_ms_per_token(engines[0], prompts(max(c * 2, args.loop_requests), vocab), args.new_tokens)
                loop_ms = 1e3 / statistics.mean(tps for tps, _ in loops)
                bounds.append((name, c, mm, loop_ms))
                print(f"{name:10s} concurrency {c:3d}: the engine's matrix products {mm:.3f} ms a token, the loop "
                      f"{loop_ms:.3f} ms a token: ceiling x{loop_ms / mm:.2f}", flush=True)
            if own is None:
                loop_engine.shutdown()
            for engine, (s, o, dp), kept in zip(engines, fits, pairs):
                engine.shutdown()
                tps, loop, ratio, host, loop_host = (statistics.median(p[k] for p in kept) for k in range(5))
                rows.append((name, c, s, o, dp, tps, loop, ratio, host, loop_host))
                print(f"{name:10s} concurrency {c:3d} decode steps/launch {s} overlap {o} dp {dp}: engine {tps:9.1f} "
                      f"tok/s   loop {loop:8.1f} tok/s   x{ratio:6.2f}   (pairs: "
                      f"{', '.join(f'{p[2]:.2f}' for p in kept)}); outside the forwards {_ms(host)} against "
                      f"{loop_host:.3f} ms a token", flush=True)
    print("\n| model | concurrency | decode steps a launch | overlap | dp size | engine tok/s | plain loop tok/s | ratio "
          "(median of pairs) | ms a token outside the forwards, engine / loop |\n|---|---|---|---|---|---|---|---|---|")
    for name, c, s, o, dp, tps, loop, ratio, host, loop_host in rows:
        print(f"| {name} | {c} | {s} | {o} | {dp} | {tps:.1f} | {loop:.1f} | {ratio:.2f}x | {_ms(host)} / "
              f"{loop_host:.3f} |")
    if bounds:
        print("\n| model | concurrency | engine's matrix products, ms a token | loop, ms a token | ceiling ratio |"
              "\n|---|---|---|---|---|")
        for name, c, mm, loop_ms in bounds:
            print(f"| {name} | {c} | {mm:.3f} | {loop_ms:.3f} | {loop_ms / mm:.2f}x |")


if __name__ == "__main__":
    main()
