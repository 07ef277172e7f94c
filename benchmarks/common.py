"""Shared helpers for the GPU benchmarks: timing, the copy-bandwidth ceiling, fast random init on the device."""

import ast
import importlib
import statistics
import time

import torch


def cuda_time(fn, warmup: int = 3, iters: int = 20) -> float:
    """Median seconds per call of fn, timed with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def back_to_back(fn, steps: int, rounds: int = 5) -> float:
    """Median over rounds of (seconds for `steps` calls of fn issued without waiting) / steps: a CUDA graph's
    step as the device runs it when the host keeps ahead (the engine's overlapped steady state), where cuda_time
    also counts the host's issue of each call."""
    out = []
    for _ in range(rounds):
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / steps)
    return statistics.median(out)


def hot_loop_us(fn, calls: int = 200, rounds: int = 7, warmup: int = 10) -> list[float]:
    """Mean microseconds per call of fn in each of `rounds` back-to-back loops of `calls` (host clock, no sync)."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return runs


def graph_time(fn, iters: int = 50, reps: int = 5) -> float:
    """Median seconds per call of fn captured `iters` times in one CUDA graph (launch gaps shrink to the floor)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return cuda_time(g.replay, warmup=2, iters=reps) / iters


def replay_ms(graph: "torch.cuda.CUDAGraph", replays: int = 200) -> float:
    """Device ms per replay of an already-captured graph, replayed back to back (the device's share of a step)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp32."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def pdl_device() -> tuple[torch.device, int, float]:
    """The CUDA device with Kestrel's kernels launched under PDL (the decode graph's form): (device, SMs, copy
    bandwidth in bytes/s measured now)."""
    import kestrel.ops

    kestrel.ops.PDL = True
    dev = torch.device("cuda")
    return dev, torch.cuda.get_device_properties(dev).multi_processor_count, copy_bandwidth()


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    n = int(gib * (1 << 30)) // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    t = cuda_time(lambda: y.copy_(x), warmup=3, iters=10)
    x = y = None  # free the buffers now (the lambda above holds the names)
    return 2 * n * 4 / t


class Log:
    """Print and keep every line, so the full log lands under $OUT."""

    def __init__(self, path: str | None):
        self.path, self.lines = path, []

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.lines.append(s)
        if self.path:
            with open(self.path, "a") as f:
                f.write(s + "\n")


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def cuda_events(step, steps: int):
    """The profiler's events over `steps` calls of step (after one untraced call)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof.events()


def timeline(step, log, label: str, min_us: float = 4.0):
    """One call of step under the profiler, on one clock from the call's start: when the host finished issuing it,
    each host op of at least min_us and each GPU kernel or copy (start-end, us). The GPU's idle stretches show where
    the host, not the kernels, sets the wall time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("timeline_call"):
            step()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    call = next(e for e in evs if e.name == "timeline_call" and e.device_type.name == "CPU")
    t0 = call.time_range.start

    def span(e):
        return f"{e.name[:28]} {e.time_range.start - t0:.0f}-{e.time_range.end - t0:.0f}"
    host = [e for e in evs if e.device_type.name == "CPU" and e is not call and e.time_range.elapsed_us() >= min_us
            and call.time_range.start <= e.time_range.start <= call.time_range.end]
    gpu = [e for e in evs if e.device_type.name == "CUDA" and e.name != "timeline_call"]
    log(f"timeline ({label}): host issue 0-{call.time_range.end - t0:.0f} us")
    log("  host: " + ", ".join(span(e) for e in sorted(host, key=lambda e: e.time_range.start)[:30]))
    log("  gpu:  " + ", ".join(span(e) for e in sorted(gpu, key=lambda e: e.time_range.start)))


def kernel_times(step, steps: int = 5) -> dict:
    """{kernel name: (launches, GPU microseconds)} per call of step, from the profiler."""
    agg = {}
    for e in cuda_events(step, steps):
        if e.device_type.name == "CUDA":
            n, t = agg.get(e.name, (0, 0.0))
            agg[e.name] = (n + 1, t + e.device_time)
    return {name: (n / steps, t / steps) for name, (n, t) in agg.items()}


def host_time(step, iters: int = 10) -> float:
    """Median host seconds to issue one call of step (the queue drained before each, nothing waited for after)."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times)


def kernel_breakdown(step, log, steps: int = 3, top: int = 24, label: str = "decode"):
    """GPU time per call of step by kernel name (eager: the kernels a graph of step would hold, without its gaps)."""
    agg = kernel_times(step, steps)
    total = sum(t for _, t in agg.values())
    launches = sum(n for n, _ in agg.values())
    log(f"kernel time per call ({label}): {total:.0f} us in {launches:.0f} launches")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        log(f"  {t:8.1f} us  {n:6.1f}x  {name[:90]}")


def graph_timeline(run, log, steps: int = 5, top: int = 20, label: str = "graph", sequence: range | None = None,
                   copies: bool = False):
    """Where a graphed step's wall time goes: the kernels as the GPU ran them (the profiler traces a graph's
    kernels), each charged with how far it moved the step's end (its end minus the latest end before it, so launch
    gaps and PDL waits count against the kernel that ended them, and a kernel overlapped by PDL costs little).
    copies: memory copies and sets are charged too (the engine's steps around the graph)."""
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in cuda_events(run, steps)
                if e.device_type.name == "CUDA"
                and (copies or ("memcpy" not in e.name.lower() and "memset" not in e.name.lower())))
    if not ev:
        log(f"timeline ({label}): no kernels traced")
        return
    agg, last = {}, ev[0][0]
    if sequence is not None:
        log(f"timeline ({label}), kernels {sequence.start}-{sequence.stop - 1} of the first step: start / duration / "
            "charged (us)")
    for i, (start, end, name) in enumerate(ev):
        adv = max(0.0, end - last)
        last = max(last, end)
        if sequence is not None and i in sequence:
            log(f"  {i:4d} {start - ev[0][0]:8.1f} {end - start:6.2f} {adv:6.2f}  {name[:60]}")
        n, a, d = agg.get(name, (0, 0.0, 0.0))
        agg[name] = (n + 1, a + adv, d + (end - start))
    span = (ev[-1][1] - ev[0][0]) / steps
    dur = sum(d for _, _, d in agg.values()) / steps
    log(f"timeline ({label}): {len(ev) / steps:.0f} kernels a step, span {span:.0f} us a step, kernel durations "
        f"sum {dur:.0f} us; charged time by kernel (us a step, launches, mean duration us):")
    for name, (n, a, d) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        log(f"  {a / steps:8.1f} us  {n / steps:6.1f}x  {d / n:6.2f}  {name[:80]}")


def parse_knob(spec: str) -> tuple[object, str, list]:
    """'package.module.NAME=v1,v2' -> (module, NAME, [v1, v2]) with Python literals."""
    path, values = spec.split("=", 1)
    mod, name = path.rsplit(".", 1)
    return importlib.import_module(mod), name, [ast.literal_eval(v) for v in values.split(",")]
