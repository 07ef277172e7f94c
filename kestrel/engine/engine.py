"""The offline API in the style of SGLang's Engine: `Engine(model=...).generate(...)` in-process.

    with kestrel.Engine() as engine:                      # the bundled k3-small
        out = engine.generate("def fib(n):", {"max_new_tokens": 32, "temperature": 0})
        print(out["text"], out["meta_info"]["finish_reason"])
"""

import time
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
        self.core = EngineCore(self.server_args)
        self.tokenizer = self.core.tokenizer

    # ---- the API
    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, return_logprob: bool = False,
                 top_logprobs_num: int = 0, stream: bool = False):
        """Returns one dict per request (a dict for a single prompt with n = 1, else a list); an iterator of
        cumulative output dicts with stream=True."""
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, return_logprob, top_logprobs_num)
        for r in reqs:
            self.core.add_request(r)
        if stream:
            return self._stream(reqs)
        self._run_until_done(reqs)
        outs = [output_dict(r, self.tokenizer, i) for i, r in enumerate(reqs)]
        return outs[0] if single else outs

    def shutdown(self) -> None:
        self.core.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def metrics(self) -> dict:
        return self.core.metrics()

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
