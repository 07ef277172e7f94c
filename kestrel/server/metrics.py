"""Prometheus metrics: latencies observed by the front end (what a client sees) plus the engine core's counters and
pool usage, pulled from EngineCore.metrics() at scrape time."""

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kestrel.engine.request import Req

PREFIX = "kestrel:"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                    2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)

# EngineCore.metrics() keys -> help; keys ending in _total are counters
CORE_METRICS = {
    "num_running_reqs": "requests being run by the engine",
    "num_waiting_reqs": "requests queued in the engine",
    "prompt_tokens_total": "prompt tokens admitted (prefix-cache hits included)",
    "computed_prompt_tokens_total": "prompt tokens run through a prefill forward",
    "generation_tokens_total": "tokens generated",
    "cached_tokens_total": "prompt tokens served from the prefix cache",
    "retractions_total": "requests retracted under memory pressure",
    "forwards_total": "forward passes",
    "kv_pages_used": "MLA KV pages in use (the prefix cache's included)",
    "kv_pages_total": "MLA KV pages in the pool",
    "kv_pages_cached": "MLA KV pages owned by the prefix cache",
    "state_slots_used": "KDA state slots in use (the prefix cache's included)",
    "state_slots_total": "KDA state slots in the pool",
    "state_slots_cached": "KDA state slots owned by the prefix cache",
    "kv_usage": "fraction of KV pages in use",
    "state_usage": "fraction of state slots in use",
    "page_size": "tokens per KV page",
    "spec_verify_steps_total": "speculative verify steps (one per request per step)",
    "spec_draft_tokens_total": "draft tokens verified (after the verify planner's cuts)",
    "spec_accepted_tokens_total": "draft tokens accepted",
    "spec_accept_length": "tokens per verify step since start (accepted drafts + the target's token)",
}


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.snapshot: dict = {}

        def histogram(name, help_):
            return Histogram(PREFIX + name, help_, ["model_name"], buckets=_LATENCY_BUCKETS,
                             registry=self.registry).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "time to first token, seen by the front end")
        self.itl = histogram("inter_token_latency_seconds", "time between tokens, seen by the front end")
        self.e2e = histogram("e2e_request_latency_seconds", "request latency from arrival to its last token")
        self.finished = Counter(PREFIX + "requests_finished", "requests finished, by finish reason",
                                ["model_name", "finish_reason"], registry=self.registry)
        self.registry.register(_CoreCollector(self))

    def on_tokens(self, req: Req, last_at: float | None, now: float, n: int) -> None:
        """n tokens of req arrived at `now`, the previous ones at last_at (several at once share the gap)."""
        if req.first_token_at is None:
            self.ttft.observe(now - req.created_at)
            n, last_at = n - 1, now
        for _ in range(n):
            self.itl.observe((now - last_at) / n)

    def on_finish(self, req: Req, now: float) -> None:
        self.e2e.observe(now - req.created_at)
        self.finished.labels(self.model_name, req.finish_reason["type"]).inc()

    def render(self, snapshot: dict) -> bytes:
        self.snapshot = snapshot
        return generate_latest(self.registry)


class _CoreCollector:
    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self):
        for key, help_ in CORE_METRICS.items():
            if key not in self.metrics.snapshot:
                continue
            value = float(self.metrics.snapshot[key])
            if key.endswith("_total"):
                fam = CounterMetricFamily(PREFIX + key[: -len("_total")], help_, labels=["model_name"])
            else:
                fam = GaugeMetricFamily(PREFIX + key, help_, labels=["model_name"])
            fam.add_metric([self.metrics.model_name], value)
            yield fam
