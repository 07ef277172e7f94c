"""`kestrel bench`: a serving benchmark in the manner of sglang.bench_serving.

    kestrel bench --port 30000 --num-prompts 200 --random-input-len 256 --random-output-len 128 \
        --max-concurrency 1,8,64 --output-file bench.json
    kestrel bench --launch-server --model k3-tiny --dtype float32 --dataset-name shared-prefix

Workloads are token-level and seeded: `random` (lengths uniform in [ratio * len, len]), `shared-prefix` (groups
of prompts that share a long system prompt) and `multi-turn` (conversations whose every turn resends the history
and its answers). Prompts go out as token ids, or as text made with the tokenizer (--prompt-format text). Each
request streams /generate (backend kestrel) or /v1/completions (backend openai) with ignore_eos, so output
lengths are exact. Arrivals are Poisson at --request-rate, capped at --max-concurrency in flight; each
concurrency in a comma list is one run. Reports request and token throughput and TTFT / ITL / end-to-end latency
(mean, p50, p90, p99) as a table, the runs as JSON, and PNG plots (latency CDFs; throughput against concurrency).
"""

import argparse
import asyncio
import json
import logging
import math
import random
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kestrel.config import ServerArgs


@dataclass
class Request:
    prompt: list[int]
    output_len: int
    conversation: int | None = None  # multi-turn: the turns of one conversation run in order


@dataclass
class Result:
    ok: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    error: str = ""


# ---- command line
def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--api-key", default=None)
    g.add_argument("--backend", choices=("kestrel", "openai"), default="kestrel",
                   help="kestrel: streaming /generate; openai: streaming /v1/completions")
    g.add_argument("--launch-server", action="store_true",
                   help="start `kestrel serve` with the model flags below on a free port, stop it afterwards")
    g = p.add_argument_group("workload")
    g.add_argument("--dataset-name", choices=("random", "shared-prefix", "multi-turn"), default="random")
    g.add_argument("--num-prompts", type=int, default=200, help="requests per run (multi-turn: turns in all)")
    g.add_argument("--random-input-len", type=int, default=256, help="prompt tokens (multi-turn: per turn)")
    g.add_argument("--random-output-len", type=int, default=128, help="output tokens")
    g.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="lengths are uniform in [ratio * len, len] (1.0: exact)")
    g.add_argument("--shared-prefix-groups", type=int, default=8, help="shared-prefix: number of system prompts")
    g.add_argument("--system-prompt-len", type=int, default=512, help="shared-prefix: tokens of a system prompt")
    g.add_argument("--num-turns", type=int, default=4, help="multi-turn: turns per conversation")
    g.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send token ids, or text decoded by the tokenizer (re-encoded lengths are reported)")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory for text prompts (default: the model's)")
    g.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("load")
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals per second (inf: all at once)")
    g.add_argument("--max-concurrency", default=None,
                   help="requests in flight at most; a comma list (1,8,64) runs once per value")
    g.add_argument("--warmup-requests", type=int, default=1)
    g.add_argument("--disable-stream", action="store_true", help="whole responses (TTFT = latency)")
    g.add_argument("--disable-tqdm", action="store_true")
    g = p.add_argument_group("output")
    g.add_argument("--output-file", default="kestrel_bench.json", help="JSON results; plots land beside it")
    g.add_argument("--no-plot", action="store_true")
    g = p.add_argument_group("server (with --launch-server)")
    ServerArgs.add_cli_args(g, skip=("host", "port", "api_key"))


def main(args: argparse.Namespace) -> int:
    # one log line per request would drown the table
    logging.getLogger("httpx").setLevel(logging.WARNING)
    levels = [None] if args.max_concurrency is None else [int(x) for x in str(args.max_concurrency).split(",")]
    if args.launch_server:
        from kestrel.server.launch import LaunchedServer

        with LaunchedServer(server_flags(args), host=args.host, api_key=args.api_key) as srv:
            print(f"launched a server at {srv.url}", file=sys.stderr)
            report = run(args, srv.url, levels)
    else:
        report = run(args, args.base_url or f"http://{args.host}:{args.port}", levels)
    print(table(report["runs"]))
    out = Path(args.output_file)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {out}")
    if not args.no_plot:
        for path in plot(report["runs"], out):
            print(f"plot: {path}")
    return 0 if all(r["completed"] for r in report["runs"]) else 1


def server_flags(args: argparse.Namespace) -> list[str]:
    """The ServerArgs flags given to bench that differ from their defaults, for `kestrel serve`."""
    import dataclasses

    flags = []
    for f in dataclasses.fields(ServerArgs):
        if f.name in ("host", "port", "api_key"):
            continue
        value = getattr(args, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        flags += [flag] if isinstance(value, bool) else [flag, str(value)]
    return flags


# ---- workloads
def make_workload(args: argparse.Namespace, vocab: list[int]) -> list[Request]:
    rng = random.Random(args.seed)

    def length(n: int) -> int:
        return rng.randint(max(1, int(n * args.random_range_ratio)), max(1, n))

    def tokens(n: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(n)]

    n = args.num_prompts
    if args.dataset_name == "random":
        return [Request(tokens(length(args.random_input_len)), length(args.random_output_len)) for _ in range(n)]
    if args.dataset_name == "shared-prefix":
        systems = [tokens(args.system_prompt_len) for _ in range(args.shared_prefix_groups)]
        reqs = [Request(systems[i % len(systems)] + tokens(length(args.random_input_len)),
                        length(args.random_output_len)) for i in range(n)]
        rng.shuffle(reqs)
        return reqs
    turns = max(1, args.num_turns)
    # a conversation's later prompts are built from its earlier answers while the run goes on (see _conversation)
    return [Request(tokens(length(args.random_input_len)), length(args.random_output_len), conversation=i // turns)
            for i in range(max(turns, n // turns * turns))]


def sampleable_ids(tokenizer, vocab_size: int) -> list[int]:
    """Token ids a random prompt may use: not special tokens (their text would not survive a round trip)."""
    special = set()
    if tokenizer is not None:
        special = set(tokenizer.tok.get_added_tokens_decoder())
    return [t for t in range(vocab_size) if t not in special]


# ---- one run
def run(args: argparse.Namespace, url: str, levels: list[int | None]) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    info = httpx.get(url + "/get_model_info", headers=headers, timeout=30).json()
    tokenizer = load_tokenizer(args) if args.prompt_format == "text" else None
    if args.prompt_format == "text" and tokenizer is None:
        raise SystemExit("--prompt-format text needs a tokenizer: pass --tokenizer DIR")
    requests = make_workload(args, sampleable_ids(tokenizer, info["vocab_size"]))
    runs = []
    for level in levels:
        bench = Runner(args, url, headers, info["served_model_name"], tokenizer, level)
        runs.append(asyncio.run(bench.run(requests)))
    config = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in vars(args).items()
              if not callable(v)}
    return {"url": url, "model": info["served_model_name"], "config": config, "runs": runs}


def load_tokenizer(args: argparse.Namespace):
    from kestrel.models.registry import BUNDLED
    from kestrel.tokenizer import Tokenizer

    path = args.tokenizer or getattr(args, "tokenizer_path", None)
    if path is None and (BUNDLED / "tokenizer.json").exists():
        path = BUNDLED
    return Tokenizer(path) if path else None


class Runner:
    """One run of a workload at one concurrency against a server."""

    def __init__(self, args, url: str, headers: dict, model: str, tokenizer, concurrency: int | None):
        self.args, self.url, self.headers, self.model = args, url, headers, model
        self.tokenizer, self.concurrency = tokenizer, concurrency
        self.rng = random.Random(args.seed + 1)

    async def run(self, requests: list[Request]) -> dict:
        from tqdm.auto import tqdm

        # one single-connection client per request in flight: httpx's shared pool rescans every connection on
        # every event, which at 64 streams costs the benchmark more CPU than the server spends
        self.idle: list[httpx.AsyncClient] = []
        # one TLS context for all of them (building one reads the CA bundle: ~50 ms)
        self.tls = ssl.create_default_context()
        try:
            for r in requests[: self.args.warmup_requests]:
                await self._send(Request(r.prompt[:16], 4))
            self.sem = asyncio.Semaphore(self.concurrency) if self.concurrency else None
            self.bar = tqdm(total=len(requests), disable=self.args.disable_tqdm, desc=f"concurrency {self.concurrency}")
            start = time.perf_counter()
            results = await self._arrivals(requests)
            duration = time.perf_counter() - start
            self.bar.close()
        finally:
            for http in self.idle:
                await http.aclose()
        return summarize(results, duration, self.concurrency, self.args.request_rate)

    def _client(self) -> httpx.AsyncClient:
        if self.idle:
            return self.idle.pop()
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=10)
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=None, limits=limits, verify=self.tls)

    async def _arrivals(self, requests: list[Request]) -> list[Result]:
        """Poisson arrivals of requests (multi-turn: of conversations, whose turns then follow one another)."""
        units: list[list[Request]] = []
        for r in requests:
            if r.conversation is not None and units and units[-1][0].conversation == r.conversation:
                units[-1].append(r)
            else:
                units.append([r])
        tasks = []
        for unit in units:
            tasks.append(asyncio.create_task(self._conversation(unit)))
            if math.isfinite(self.args.request_rate):
                await asyncio.sleep(self.rng.expovariate(self.args.request_rate))
        return [r for rs in await asyncio.gather(*tasks) for r in rs]

    async def _conversation(self, turns: list[Request]) -> list[Result]:
        results, history = [], []
        for turn in turns:
            prompt = history + turn.prompt
            res = await self._limited(Request(prompt, turn.output_len))
            results.append(res)
            history = prompt + res.output_ids
        return results

    async def _limited(self, req: Request) -> Result:
        if self.sem is None:
            res = await self._send(req)
        else:
            async with self.sem:
                res = await self._send(req)
        self.bar.update(1)
        return res

    async def _send(self, req: Request) -> Result:
        a = self.args
        prompt = self.tokenizer.decode(req.prompt, False) if self.tokenizer is not None else req.prompt
        res = Result(prompt_len=len(self.tokenizer.encode(prompt)) if self.tokenizer is not None else len(prompt))
        stream = not a.disable_stream
        if a.backend == "kestrel":
            path = "/generate"
            body = {("text" if isinstance(prompt, str) else "input_ids"): prompt, "stream": stream,
                    "sampling_params": {"max_new_tokens": req.output_len, "temperature": 0, "ignore_eos": True}}
        else:
            path = "/v1/completions"
            body = {"model": self.model, "prompt": prompt, "max_tokens": req.output_len, "temperature": 0,
                    "ignore_eos": True, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
        http = self._client()
        try:
            await self._exchange(http, path, body, stream, res)
            res.ok = res.output_len == req.output_len
            if not res.ok and not res.error:
                res.error = f"got {res.output_len} output tokens, expected {req.output_len}"
        except (httpx.HTTPError, OSError, ValueError, KeyError) as e:
            res.error = f"{type(e).__name__}: {e}"
        finally:
            self.idle.append(http)
        return res

    async def _exchange(self, http: httpx.AsyncClient, path: str, body: dict, stream: bool, res: Result) -> None:
        """One request; fills res with its output length, TTFT, ITLs (tokens of one chunk share its gap) and
        latency."""
        start = last = time.perf_counter()
        async with http.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return
            if not stream:
                res.output_len, res.output_ids = self._parse_whole(json.loads(await resp.aread()))
                res.ttft = time.perf_counter() - start
            async for line in resp.aiter_lines() if stream else _nothing():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                new = self._parse_chunk(json.loads(line[6:]), res)
                if new > 0 and res.ttft == 0.0:
                    res.ttft, last, new = now - start, now, new - 1
                if new > 0:
                    res.itl += [(now - last) / new] * new
                    last = now
        res.latency = time.perf_counter() - start

    def _parse_chunk(self, chunk: dict, res: Result) -> int:
        """New output tokens in a streamed chunk (the result's totals updated)."""
        if "error" in chunk:
            res.error = chunk["error"].get("message", "error")
            return 0
        if self.args.backend == "kestrel":
            ids = chunk["output_ids"]
            new = len(ids) - res.output_len
            res.output_len, res.output_ids = len(ids), ids
            return new
        if chunk.get("usage"):
            res.output_len = chunk["usage"]["completion_tokens"]
            return 0
        # a completions chunk carries text, not a token count: count chunks as tokens (as sglang does)
        return 1 if chunk["choices"] and (chunk["choices"][0]["text"] or chunk["choices"][0]["finish_reason"]) else 0

    def _parse_whole(self, out: dict) -> tuple[int, list[int]]:
        if self.args.backend == "kestrel":
            return len(out["output_ids"]), out["output_ids"]
        return out["usage"]["completion_tokens"], []


# ---- report
async def _nothing():
    return
    yield


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(results: list[Result], duration: float, concurrency: int | None, rate: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    run = {"max_concurrency": concurrency, "request_rate": rate if math.isfinite(rate) else "inf",
           "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
           "input_tokens": in_tokens, "output_tokens": out_tokens,
           "request_throughput": len(ok) / duration, "input_throughput": in_tokens / duration,
           "output_throughput": out_tokens / duration, "total_throughput": (in_tokens + out_tokens) / duration,
           "achieved_concurrency": sum(r.latency for r in ok) / duration,
           "errors": sorted({r.error for r in results if r.error})[:5]}
    series = {"ttft": [r.ttft for r in ok], "itl": [x for r in ok for x in r.itl], "e2e": [r.latency for r in ok]}
    for name, values in series.items():
        run[f"mean_{name}_ms"] = 1e3 * sum(values) / len(values) if values else float("nan")
        for q in (50, 90, 99):
            run[f"p{q}_{name}_ms"] = 1e3 * _pct(values, q / 100)
    run["samples"] = {name: values for name, values in series.items()}
    run["samples"]["prompt_lens"] = [r.prompt_len for r in ok]
    run["samples"]["output_lens"] = [r.output_len for r in ok]
    return run


_ROWS = [("completed requests", "completed", "d"), ("failed requests", "failed", "d"),
         ("duration (s)", "duration_s", ".2f"), ("request throughput (req/s)", "request_throughput", ".2f"),
         ("input throughput (tok/s)", "input_throughput", ".1f"),
         ("output throughput (tok/s)", "output_throughput", ".1f"),
         ("total throughput (tok/s)", "total_throughput", ".1f"),
         ("achieved concurrency", "achieved_concurrency", ".1f")]
_ROWS += [(f"{q} {name} (ms)", f"{q.lower()}_{key}_ms", ".2f")
          for key, name in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E latency"))
          for q in ("Mean", "P50", "P90", "P99")]


def table(runs: list[dict]) -> str:
    heads = [f"concurrency {r['max_concurrency'] or 'inf'}" for r in runs]
    width = max(len(label) for label, _, _ in _ROWS) + 2
    cols = [max(14, len(h) + 2) for h in heads]
    lines = ["=" * (width + sum(cols)), "Serving benchmark".center(width + sum(cols)),
             "".ljust(width) + "".join(h.rjust(c) for h, c in zip(heads, cols)), "-" * (width + sum(cols))]
    for label, key, fmt in _ROWS:
        lines.append(label.ljust(width) + "".join(format(r[key], fmt).rjust(c) for r, c in zip(runs, cols)))
    lines.append("=" * (width + sum(cols)))
    for r in runs:
        for e in r["errors"]:
            lines.append(f"error (concurrency {r['max_concurrency']}): {e}")
    return "\n".join(lines)


def plot(runs: list[dict], out: Path) -> list[Path]:
    """Latency CDFs (one line per run) and, with several concurrencies, throughput and latency against them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, (("ttft", "time to first token"), ("itl", "inter-token latency"),
                                       ("e2e", "end-to-end latency"))):
        for r in runs:
            values = sorted(1e3 * x for x in r["samples"][key])
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                        label=f"concurrency {r['max_concurrency'] or 'inf'}")
        ax.set(title=title, xlabel="ms", ylabel="fraction of samples")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    paths.append(out.with_name(out.stem + "_latency_cdf.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    levels = [r for r in runs if r["max_concurrency"]]
    if len(levels) > 1:
        x = [r["max_concurrency"] for r in levels]
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        a.plot(x, [r["output_throughput"] for r in levels], "o-", label="output")
        a.plot(x, [r["total_throughput"] for r in levels], "s--", label="input + output")
        a.set(xscale="log", title="throughput against concurrency", xlabel="max concurrency", ylabel="tokens/s")
        a.legend()
        for key, label in (("p50_ttft_ms", "TTFT p50"), ("p50_itl_ms", "ITL p50"), ("p99_itl_ms", "ITL p99")):
            b.plot(x, [r[key] for r in levels], "o-", label=label)
        b.set(xscale="log", yscale="log", title="latency against concurrency", xlabel="max concurrency", ylabel="ms")
        b.legend()
        for ax in (a, b):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        paths.append(out.with_name(out.stem + "_throughput.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths
