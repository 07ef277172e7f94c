"""EngineCore: scheduler + model runner + memory, driven one step at a time.

The offline Engine runs it in-process; the server runs it in its own process behind ZMQ. Requests enter as token
ids and leave as token ids: tokenising and detokenising belong to the front end (stop strings excepted, which
the core checks on a decoded tail so that generation stops as early as it can).
"""

import gc
import logging
import random
import uuid

import torch

from kestrel.config import ServerArgs
from kestrel.engine.model_runner import ModelRunner
from kestrel.engine.request import Req
from kestrel.engine.sampling_params import InvalidRequest, SamplingParams
from kestrel.engine.scheduler import Scheduler
from kestrel.mem.manager import MemoryManager, NoCache
from kestrel.models.registry import resolve
from kestrel.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def freeze_gc() -> None:
    """Collect what is garbage now (an engine shut down earlier in this process, start-up temporaries) and move
    every object alive, the model, pools and CUDA graphs included, out of the collector's generations (as vLLM
    does after start-up): later collections neither walk them nor, in the middle of a step, free an earlier
    engine's cycles. On the H200 such collections took 0.95-1.04 s inside one prefill step of a DSpark engine
    started after others in the same process (`benchmarks/speculative.py` section 2's stall watch). Objects frozen
    here are unfrozen when an engine shuts down and by the next engine's start."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class EngineCore:
    def __init__(self, args: ServerArgs, model=None, dp_rank: int = 0):
        """dp_rank: this core's place among --dp-size replicas (each draws its own seeds for unseeded sampling)."""
        self.args = args
        torch.manual_seed(args.random_seed)
        owns_model = model is None  # a model handed in is the caller's: its storage layout is left alone
        if model is None:
            resolved = resolve(args.model_path, args.torch_dtype, args.resolved_device, args.random_seed)
            model, self.model_name, tok_dir = resolved.model, resolved.name, resolved.tokenizer_dir
        else:
            self.model_name, tok_dir = args.model_path or "model", None
        self.model = model
        self.cfg = model.cfg
        self.model_name = args.served_model_name or self.model_name
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            path = args.tokenizer_path or tok_dir
            if path is None:
                raise ValueError(f"model {self.model_name!r} has no tokenizer; pass --tokenizer-path or "
                                 f"--skip-tokenizer-init to run on token ids")
            self.tokenizer = Tokenizer(path)
        self.context_len = min(args.context_length or self.cfg.model_max_length, self.cfg.model_max_length)
        cache = self._make_cache()
        self.runner = ModelRunner(args, model, cache.slots_per_request, owns_model)
        self.mm = MemoryManager(self.runner.mem, cache)
        self.scheduler = Scheduler(args, self.runner, self.mm, self._stop_checker if self.tokenizer else None,
                                   self.context_len)
        self.eos_ids = set(self.cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self._rng = random.Random(args.random_seed + (dp_rank << 32))
        self._arrival = 0
        # finished before reaching the scheduler (max_new_tokens = 0)
        self._finished: list[Req] = []
        freeze_gc()

    def _make_cache(self):
        if self.args.disable_radix_cache:
            return NoCache()
        from kestrel.mem.radix_cache import RadixCache

        return RadixCache(self.args, self.cfg, checkpoint_every_chunk=self.args.state_checkpoint_policy == "every-chunk")

    # ---- requests
    def make_request(self, input_ids: list[int], params: SamplingParams | dict | None = None, rid: str | None = None,
                     return_logprob: bool = False, top_logprobs_num: int = 0) -> Req:
        """Validate and build a request (raises InvalidRequest naming the problem)."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.from_dict(params)
        params.validate(self.cfg.vocab_size)
        if not input_ids:
            raise InvalidRequest("the prompt is empty")
        bad = [t for t in input_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise InvalidRequest(f"token id {bad[0]!r} is outside the vocabulary [0, {self.cfg.vocab_size})")
        if len(input_ids) >= self.context_len:
            raise InvalidRequest(f"the prompt has {len(input_ids)} tokens; the context length is {self.context_len}")
        if params.stop and self.tokenizer is None:
            raise InvalidRequest("stop strings need a tokenizer; use stop_token_ids with --skip-tokenizer-init")
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= 20:
            raise InvalidRequest(f"top_logprobs_num = {top_logprobs_num!r}: must be an integer in [0, 20]")
        params.max_new_tokens = min(params.max_new_tokens, self.context_len - len(input_ids))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        self._arrival += 1
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        return Req(rid or uuid.uuid4().hex, list(input_ids), params, self._arrival, seed, return_logprob,
                   top_logprobs_num, frozenset(stop_ids))

    def add_request(self, req: Req) -> None:
        if req.params.max_new_tokens == 0:
            req.finish_reason = {"type": "length", "length": 0}
            self._finished.append(req)
            return
        self.scheduler.add(req)

    def abort(self, rid: str, message: str | None = None) -> bool:
        return self.scheduler.abort(rid, message)

    def step(self) -> list[Req]:
        """One scheduler iteration; returns the requests that got tokens or finished (each finish reported once)."""
        done, self._finished = self._finished, []
        return done + self.scheduler.step()

    def has_work(self) -> bool:
        return bool(self._finished) or self.scheduler.has_work()

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        self.runner.release()
        gc.unfreeze()

    def _stop_checker(self, req: Req) -> str | None:
        longest = max(len(s) for s in req.params.stop)
        tail = self.tokenizer.decode(req.output_ids[-(longest + 4):], req.params.skip_special_tokens)
        return next((s for s in req.params.stop if s in tail), None)

    # ---- observability
    def metrics(self) -> dict:
        s, mm = self.scheduler.stats, self.mm
        kv_total, slot_total = mm.kv.pages.capacity, mm.state.slots.capacity
        cache_pages, cache_slots = mm.cache.owned()
        out = {
            "num_running_reqs": sum(1 for r in self.scheduler.running if not r.finished),
            "num_waiting_reqs": len(self.scheduler.waiting),
            "prompt_tokens_total": s.prompt_tokens,
            "computed_prompt_tokens_total": s.computed_prompt_tokens,
            "generation_tokens_total": s.generation_tokens,
            "cached_tokens_total": s.cached_tokens,
            "retractions_total": s.retractions,
            "forwards_total": s.forwards,
            "kv_pages_used": kv_total - mm.num_free_pages,
            "kv_pages_total": kv_total,
            "kv_pages_cached": len(cache_pages),
            "state_slots_used": slot_total - mm.num_free_slots,
            "state_slots_total": slot_total,
            "state_slots_cached": len(cache_slots),
            "kv_usage": (kv_total - mm.num_free_pages) / max(kv_total, 1),
            "state_usage": (slot_total - mm.num_free_slots) / max(slot_total, 1),
            "page_size": self.args.page_size,
        }
        if self.args.speculative:
            out.update(spec_verify_steps_total=s.spec_verify_steps, spec_draft_tokens_total=s.spec_draft_tokens,
                       spec_accepted_tokens_total=s.spec_accepted_tokens,
                       # tokens per verify step since start (accepted drafts + the target's token): SGLang's
                       # accept length
                       spec_accept_length=accept_length(s.spec_accepted_tokens, s.spec_verify_steps))
        return out


def merge_metrics(snapshots: list[dict]) -> dict:
    """One snapshot for data-parallel replicas (EngineCore.metrics of each): counts summed, ratios recomputed from
    the sums."""
    if len(snapshots) == 1:
        return dict(snapshots[0])
    ratios = {"kv_usage": ("kv_pages_used", "kv_pages_total"), "state_usage": ("state_slots_used", "state_slots_total")}
    out = {k: (v if k == "page_size" else sum(s[k] for s in snapshots)) for k, v in snapshots[0].items()
           if k not in ratios and k != "spec_accept_length"}
    for k, (used, total) in ratios.items():
        out[k] = out[used] / max(out[total], 1)
    if "spec_accept_length" in snapshots[0]:
        out["spec_accept_length"] = accept_length(out["spec_accepted_tokens_total"], out["spec_verify_steps_total"])
    return out


def accept_length(accepted: int, steps: int) -> float:
    """Tokens per verify step: the accepted drafts plus each step's own token from the target."""
    return (accepted + steps) / max(steps, 1)
