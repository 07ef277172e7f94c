"""ServerArgs: the single source of flags and defaults (SGLang's names where one exists).

argparse reads the fields and their help strings (`add_cli_args` / `from_cli`); derived values are properties.
"""

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field

import torch

# the most verify steps one speculative launch may chain (`speculative_launch_steps`)
MAX_LAUNCH_STEPS = 8
# the most plain decode steps one launch may run (`num_continuous_decode_steps`)
MAX_DECODE_STEPS = 32


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class ServerArgs:
    # model
    model_path: str | None = _f(None, "checkpoint directory or preset name (k3-tiny, k3-small, k3-mini, ...); "
                                      "default: the bundled k3-small", aliases=("--model",))
    tokenizer_path: str | None = _f(None, "tokenizer directory (default: the model's)")
    skip_tokenizer_init: bool = _f(False, "run on token ids alone (no tokenizer files needed)")
    dtype: str = _f("auto", "auto, float32, bfloat16, float16 or float64 (auto: bfloat16 on GPU, float32 on CPU)")
    device: str = _f("auto", "auto, cpu or cuda")
    context_length: int | None = _f(None, "maximum tokens per request, prompt included (default: the model's)")
    served_model_name: str | None = _f(None, "model name reported by the API (default: the model path's name)")
    random_seed: int = _f(0, "seed for weights of random presets and for unseeded sampling")
    # memory
    page_size: int = _f(1, "tokens per MLA KV page (any value >= 1)")
    max_total_tokens: int | None = _f(None, "MLA KV cache capacity in tokens (default: sized from free memory)")
    max_state_slots: int | None = _f(None, "KDA state slots (default: sized from max_running_requests)")
    mem_fraction_static: float = _f(0.85, "fraction of free GPU memory for weights and caches")
    max_running_requests: int = _f(256, "maximum concurrently running requests")
    # scheduling
    chunked_prefill_size: int | None = _f(None, "maximum prefill tokens per step (prompts are cut into chunks); "
                                                "default: 2048 on a CPU, on a GPU by its memory as SGLang sizes it "
                                                "(2048 under 35 GiB, 4096 under 60 GiB, else 8192)")
    disable_overlap_schedule: bool = _f(False, "run the CPU scheduler and the forward one after the other")
    disable_host_malloc_tuning: bool = _f(False, "keep glibc's default malloc thresholds (by default an engine that "
                                                  "computes on the CPU keeps freed host memory in the heap: see "
                                                  "kestrel/engine/host_malloc.py)")
    num_continuous_decode_steps: int = _f(1, "decode steps one launch runs before the scheduler sees their tokens "
                                             "(fewer scheduler passes a token; a request that stops early wastes up to "
                                             "n-1 steps, and tokens stream n at a time). Plain decoding only: a "
                                             "speculative engine chains verify steps with --speculative-launch-steps")
    schedule_policy: str = _f("fcfs", "admission order: fcfs (first come, first served)")
    # data parallelism
    dp_size: int = _f(1, "data-parallel replicas: each a core process with its own copy of the model, caches and "
                         "scheduler (so limits such as --max-running-requests apply to each). On a CPU the replicas "
                         "split the torch threads between them; on GPUs replica r runs on the r-th GPU from the one "
                         "--device names")
    load_balance_method: str = _f("round_robin", "how requests are spread over the --dp-size replicas: round_robin, "
                                                 "or shortest_queue (the replica with the fewest unfinished requests)")
    # prefix cache
    disable_radix_cache: bool = _f(False, "turn the prefix cache off")
    state_track_interval: int = _f(256, "decode tokens between KDA state snapshots (a multiple of the grid)")
    max_states_per_path: int = _f(4, "state checkpoints kept per root-to-leaf path of the prefix cache")
    state_checkpoint_policy: str = _f("sparse", "sparse (per-path cap, branch points, LRU) or every-chunk (keep every "
                                                "prefill chunk's snapshot, LRU only: the naive baseline)")
    enable_unified_memory: bool = _f(False, "one byte pool for MLA KV pages and KDA state slots")
    # speculative decoding
    speculative_algorithm: str | None = _f(None, "dspark, or none")
    speculative_draft_model_path: str | None = _f(None, "drafter checkpoint (default: the bundled drafter)")
    speculative_num_draft_tokens: int = _f(7, "draft block size gamma")
    speculative_state_rollback: str = _f("replay", "how a verify step rolls KDA state back: replay (ReplaySSM: store "
                                                   "step inputs, fold the accepted prefix) or snapshot (a state per step)")
    disable_verify_planner: bool = _f(False, "verify every drafted token (no pruning by the verify planner)")
    speculative_launch_steps: int = _f(0, "greedy verify steps one launch chains on the device before the host "
                                          "reads their results (fewer host round trips a token); 0: auto (2 with "
                                          "CUDA graphs and ReplaySSM below batch 8, else 1)")
    speculative_context_lookup: str = _f("auto", "where the drafter doubts its first token, draft what followed the "
                                                 "latest earlier occurrence of the context's last n-gram instead: on, "
                                                 "off, or auto (the engine's choice: on)")
    # GPU
    disable_cuda_graph: bool = _f(False, "run decode without CUDA graphs")
    cuda_graph_max_bs: int = _f(256, "largest decode batch captured in a CUDA graph")
    disable_pdl: bool = _f(False, "launch the decode kernels without programmatic dependent launch (it is on by "
                                  "default on Hopper and later; see docs/kernels.md)")
    # server
    host: str = _f("127.0.0.1", "address to bind (loopback unless told otherwise)")
    port: int = _f(30000, "HTTP port")
    api_key: str | None = _f(None, "require this key as 'Authorization: Bearer KEY'")
    log_level: str = _f("info", "logging level")
    enable_metrics: bool = _f(True, "serve Prometheus metrics at /metrics")
    stream_interval: int = _f(1, "tokens between streamed updates of a request (the first token goes at once); "
                                 "larger values cost the front end less per token")

    def __post_init__(self):
        def need(name, ok, why):
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)!r}: {why}")

        need("page_size", self.page_size >= 1, "must be >= 1")
        need("chunked_prefill_size", self.chunked_prefill_size is None or self.chunked_prefill_size >= 1,
             "must be >= 1")
        need("max_running_requests", self.max_running_requests >= 1, "must be >= 1")
        need("stream_interval", self.stream_interval >= 1, "must be >= 1")
        need("dtype", self.dtype in ("auto", "float32", "bfloat16", "float16", "float64"), "unknown dtype")
        need("device", self.device in ("auto", "cpu") or self.device.startswith("cuda"), "must be auto, cpu or cuda")
        need("schedule_policy", self.schedule_policy == "fcfs", "only fcfs is implemented")
        need("dp_size", isinstance(self.dp_size, int) and self.dp_size >= 1, "must be an integer >= 1")
        need("load_balance_method", self.load_balance_method in ("round_robin", "shortest_queue"),
             "round_robin or shortest_queue")
        need("state_track_interval", self.state_track_interval >= 1, "must be >= 1")
        need("max_states_per_path", self.max_states_per_path >= 1, "must be >= 1")
        need("state_checkpoint_policy", self.state_checkpoint_policy in ("sparse", "every-chunk"),
             "sparse or every-chunk")
        need("speculative_algorithm", self.speculative_algorithm in (None, "none", "dspark"), "dspark or none")
        need("speculative_num_draft_tokens", self.speculative_num_draft_tokens >= 1, "must be >= 1")
        need("speculative_launch_steps", 0 <= self.speculative_launch_steps <= MAX_LAUNCH_STEPS,
             f"must be in [0, {MAX_LAUNCH_STEPS}] (0: auto)")
        need("num_continuous_decode_steps", 1 <= self.num_continuous_decode_steps <= MAX_DECODE_STEPS,
             f"must be in [1, {MAX_DECODE_STEPS}]")
        need("num_continuous_decode_steps", self.num_continuous_decode_steps == 1 or not self.speculative,
             "a speculative engine verifies instead of decoding: use --speculative-launch-steps")
        need("speculative_context_lookup", self.speculative_context_lookup in ("auto", "on", "off"),
             "auto, on or off")
        need("speculative_state_rollback", self.speculative_state_rollback in ("replay", "snapshot"),
             "replay or snapshot")
        need("context_length", self.context_length is None or self.context_length >= 2, "must be >= 2")
        need("max_total_tokens", self.max_total_tokens is None or self.max_total_tokens >= 1, "must be >= 1")
        need("max_state_slots", self.max_state_slots is None or self.max_state_slots >= 2, "must be >= 2")

    # ---- derived values
    @property
    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def prefill_chunk_tokens(self) -> int:
        """chunked_prefill_size, or its default for the device. A GPU prefill step's host work (a few thousand
        launches) hardly grows with its tokens, so larger chunks pay there: k3-mini, 16 prompts of 512 tokens on an
        H100, 285 ms at 2048 against 137 ms at 8192 (benchmarks/prefill_batch.py, docs/kernels.md)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        dev = self.resolved_device
        if dev.type != "cuda":
            return 2048
        gib = torch.cuda.get_device_properties(dev).total_memory / (1 << 30)
        return 2048 if gib < 35 else 4096 if gib < 60 else 8192

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolved_device.type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    @property
    def overlap(self) -> bool:
        return not self.disable_overlap_schedule

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm == "dspark"

    @property
    def context_lookup(self) -> bool:
        """Whether the speculative step drafts from context lookups (`kestrel.spec.lookup`) where its drafter doubts
        itself. auto: on. It paid at batch 1 on this CPU (x1.75 -> x2.17 of plain decoding) and, once the gate and
        the windows' updates became kernels, on the H200 (1.04x and 1.08x of lookup off, served; docs/benchmarks.md,
        issue 8)."""
        if self.speculative_context_lookup == "auto":
            return True
        return self.speculative_context_lookup == "on"

    @property
    def launch_steps(self) -> int:
        """Verify steps a greedy speculative launch chains (`speculative_launch_steps`). auto: 2 where the step is
        one CUDA graph (CUDA, graphs on, ReplaySSM), where the host's work per launch, not the device, bounded the
        batch-1 step (docs/benchmarks.md, issue 8); else 1. (auto takes them below batch 8 only: verify_schedule.py's
        `AUTO_LAUNCH_MAX_BATCH`.)"""
        if self.speculative_launch_steps:
            return self.speculative_launch_steps
        graphed = (self.resolved_device.type == "cuda" and not self.disable_cuda_graph
                   and self.speculative_state_rollback == "replay")
        return 2 if graphed else 1

    def replace(self, **kw) -> "ServerArgs":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_kwargs(cls, **kw) -> "ServerArgs":
        """Engine(**kw) style: `model` is an alias of model_path; unknown names are errors that list them."""
        if "model" in kw:
            kw["model_path"] = kw.pop("model")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise TypeError(f"unknown server argument(s) {unknown}; see `kestrel serve --help`")
        return cls(**kw)

    # ---- command line
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            names = [flag, *f.metadata.get("aliases", ())]
            typ = hints[f.name]
            base = next((a for a in typing.get_args(typ) if a is not type(None)), typ)
            help_ = f"{f.metadata.get('help', '')} (default: {f.default})"
            if base is bool:
                parser.add_argument(*names, dest=f.name, action="store_true", default=f.default, help=help_)
            else:
                parser.add_argument(*names, dest=f.name, type=base, default=f.default, help=help_)

    @classmethod
    def from_cli(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})
