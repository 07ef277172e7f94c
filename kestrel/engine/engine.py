"""The offline API in the style of SGLang's Engine: `Engine(model=...).generate(...)` in-process.

    with kestrel.Engine() as engine:                      # the bundled k3-small
        out = engine.generate("def fib(n):", {"max_new_tokens": 32, "temperature": 0})
        print(out["text"], out["meta_info"]["finish_reason"])

With dp_size > 1 the engine runs its replicas as core processes, as the server does (`Replicas`).
"""

import asyncio
import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator

from kestrel.config import ServerArgs
from kestrel.engine.core import EngineCore
from kestrel.engine.request import Req
from kestrel.engine.sampling_params import InvalidRequest, SamplingParams


def finish_reason_json(req: Req) -> dict | None:
    return None if req.finish_reason is None else dict(req.finish_reason)


def output_text(req: Req, tokenizer) -> str:
    """The generated text with the matched stop string or stop token trimmed (unless no_stop_trim)."""
    if tokenizer is None:
        return ""
    ids, reason, p = req.output_ids, req.finish_reason or {}, req.params
    if reason.get("type") == "stop" and isinstance(reason.get("matched"), int) and not p.no_stop_trim:
        ids = ids[:-1]
    text = tokenizer.decode(ids, p.skip_special_tokens)
    matched = reason.get("matched")
    if reason.get("type") == "stop" and isinstance(matched, str) and not p.no_stop_trim:
        cut = text.find(matched)
        text = text[:cut] if cut >= 0 else text
    return text


def output_dict(req: Req, tokenizer, index: int = 0) -> dict:
    """SGLang's /generate response shape for one request."""
    meta = {
        "id": req.rid,
        "index": index,
        "prompt_tokens": len(req.prompt_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": finish_reason_json(req),
        "e2e_latency": (req.finished_at or time.monotonic()) - req.created_at,
    }
    if req.spec_verify_ct:
        meta["spec_verify_ct"] = req.spec_verify_ct
        meta["spec_accepted_tokens"] = req.spec_accepted
    if req.return_logprob:
        dec = (lambda t: tokenizer.decode([t], False)) if tokenizer else (lambda t: None)
        meta["output_token_logprobs"] = [(lp, t, dec(t)) for lp, t in zip(req.output_logprobs, req.output_ids)]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [[(lp, t, dec(t)) for t, lp in row] for row in req.output_top_logprobs]
    return {"text": output_text(req, tokenizer), "output_ids": list(req.output_ids), "meta_info": meta}


class Engine:
    def __init__(self, model: str | None = None, **server_args):
        if model is not None:
            server_args["model_path"] = model
        self.server_args = ServerArgs.from_kwargs(**server_args)
        self.replicas = Replicas(self.server_args) if self.server_args.dp_size > 1 else None
        self.core = None if self.replicas else EngineCore(self.server_args)
        self.tokenizer = self.replicas.info["tokenizer"] if self.replicas else self.core.tokenizer

    # ---- the API
    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, return_logprob: bool = False,
                 top_logprobs_num: int = 0, stream: bool = False):
        """Returns one dict per request (a dict for a single prompt with n = 1, else a list); an iterator of
        cumulative output dicts with stream=True."""
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, return_logprob, top_logprobs_num)
        if self.replicas:
            return self.replicas.generate(reqs, single, self.tokenizer, stream)
        for r in reqs:
            self.core.add_request(r)
        if stream:
            return self._stream(reqs)
        self._run_until_done(reqs)
        outs = [output_dict(r, self.tokenizer, i) for i, r in enumerate(reqs)]
        return outs[0] if single else outs

    def shutdown(self) -> None:
        if self.replicas:
            self.replicas.close()
        else:
            self.core.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def metrics(self) -> dict:
        return self.replicas.metrics() if self.replicas else self.core.metrics()

    # ---- internals
    def _make_requests(self, prompt, sampling_params, input_ids, return_logprob, top_logprobs_num):
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("pass exactly one of prompt and input_ids")
        if prompt is not None:
            if self.tokenizer is None:
                raise InvalidRequest("this engine has no tokenizer (skip_tokenizer_init): pass input_ids")
            single = isinstance(prompt, str)
            prompts = [prompt] if single else list(prompt)
            if not all(isinstance(p, str) for p in prompts):
                raise InvalidRequest("prompt must be a string or a list of strings")
            ids = [self.tokenizer.encode(p) for p in prompts]
        else:
            single = not input_ids or not isinstance(input_ids[0], (list, tuple))
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(ids)
        if len(params) != len(ids):
            raise InvalidRequest(f"{len(params)} sampling_params for {len(ids)} prompts")
        reqs = []
        for seq, p in zip(ids, params):
            sp = SamplingParams.from_dict(p)
            for i in range(sp.n):
                child = SamplingParams.from_dict({**(p or {}), "n": 1})
                if sp.seed is not None:
                    child.seed = sp.seed + i
                if self.replicas:  # a mirror: the replica that takes it validates it
                    reqs.append(Req(uuid.uuid4().hex, list(seq), child, 0, 0, return_logprob, top_logprobs_num))
                else:
                    reqs.append(self.core.make_request(seq, child, return_logprob=return_logprob,
                                                       top_logprobs_num=top_logprobs_num))
        return reqs, single and len(reqs) == 1

    def _run_until_done(self, reqs: list[Req]) -> None:
        pending = {r.rid for r in reqs}
        while pending:
            for r in self.core.step():
                if r.finished:
                    pending.discard(r.rid)

    def _stream(self, reqs: list[Req]) -> Iterator[dict]:
        index = {r.rid: i for i, r in enumerate(reqs)}
        pending = set(index)
        while pending:
            for r in self.core.step():
                if r.rid in index and (r.rid in pending):
                    yield output_dict(r, self.tokenizer, index[r.rid])
                    if r.finished:
                        pending.discard(r.rid)


class Replicas:
    """dp_size > 1: the server's channel to its core processes (`EngineClient`, one process a replica), run on a
    private event loop on a background thread and waited for from the caller's."""

    def __init__(self, args: ServerArgs):
        from kestrel.server.engine_client import EngineClient

        if getattr(multiprocessing.current_process(), "_inheriting", False):  # (multiprocessing's own test)
            # spawn re-runs the parent's main module in each replica: an unguarded script lands here
            raise RuntimeError("an Engine with dp_size > 1 was created while a replica process imported the main "
                               "module: create it under `if __name__ == \"__main__\":`")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kestrel-replicas", daemon=True)
        self.thread.start()

        async def make():  # the client's asyncio sockets belong to the loop that runs them
            return EngineClient(args)

        self.client = self._call(make())
        try:
            self.info = self._call(self.client.start())
        except BaseException:
            self.close()
            raise

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def generate(self, reqs: list[Req], single: bool, tokenizer, stream: bool):
        from kestrel.server.engine_client import EngineDead

        try:
            group = self._call(self.client.submit(reqs, stream=stream))
        except EngineDead as e:
            raise RuntimeError(f"the engine's replicas are not running: {e}") from e
        if stream:
            return self._stream(group, reqs, tokenizer)
        self._call(group.wait())
        outs = [output_dict(r, tokenizer, i) for i, r in enumerate(reqs)]
        return outs[0] if single else outs

    def _stream(self, group, reqs: list[Req], tokenizer) -> Iterator[dict]:
        seen = [(0, False)] * len(reqs)
        changes = group.changes()

        async def step():
            return await changes.__anext__()

        while True:
            try:
                self._call(step())
            except StopAsyncIteration:
                return
            for i, r in enumerate(reqs):
                now = (len(r.output_ids), r.finished)
                if now != seen[i]:
                    seen[i] = now
                    yield output_dict(r, tokenizer, i)

    def metrics(self) -> dict:
        return self._call(self.client.core_metrics())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if getattr(self, "client", None) is not None:
            self._call(self.client.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
