"""OpenAI's /v1/completions, /v1/chat/completions and /v1/models over the engine core.

A response is a Group of engine requests, one per (prompt, choice); choice i of prompt j has index j * n + i.
Streaming sends one chunk per choice whenever it gained text (or tokens, with logprobs), a last chunk with its
finish_reason, an optional usage chunk, then `data: [DONE]`.
"""

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response
from jinja2.exceptions import TemplateError

from kestrel.engine.engine import output_text
from kestrel.engine.request import Req
from kestrel.server.engine_client import EngineDead, Group
from kestrel.server.protocol import ChatCompletionRequest, CompletionRequest, RequestError, error_body
from kestrel.server.serving import (
    DONE,
    ClientGone,
    GroupStream,
    Served,
    TextStream,
    internal_error,
    sse,
    state,
    wait_or_disconnect,
)

router = APIRouter()

# what JSON can carry for a logprob of -inf (a token top-p / top-k ruled out)
_MIN_LOGPROB = -9999.0


@router.get("/v1/models")
async def models(request: Request) -> dict:
    st = state(request)
    return {"object": "list", "data": [{"id": st.model_name, "object": "model", "created": 0, "owned_by": "kestrel",
                                        "root": st.model_name, "max_model_len": st.context_len}]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    st = state(request)
    st.check_model(body.model)
    if body.echo:
        raise RequestError("echo is not supported", "echo")
    if body.suffix:
        raise RequestError("suffix is not supported", "suffix")
    if body.best_of not in (None, body.n):
        raise RequestError("best_of is not supported (use n)", "best_of")
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
        tok = st.need_tokenizer("a text prompt")
        prompts = [tok.encode(p) for p in ([prompt] if isinstance(prompt, str) else prompt)]
    else:
        prompts = [prompt] if not prompt or isinstance(prompt[0], int) else prompt
    params = body.sampling_params(body.max_tokens if body.max_tokens is not None else 16) | {"n": body.n}
    rid = f"cmpl-{uuid.uuid4().hex}"
    reqs = st.requests(prompts, params, rid, body.logprobs is not None, body.logprobs or 0)
    group = await st.client.submit(reqs, rid, body.stream)
    reply = _Reply(st, group, body.n, chat=False, include_usage=body.include_usage)
    return await reply.respond(request, body.stream)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    st = state(request)
    st.check_model(body.model)
    if body.tools:
        raise RequestError("tools are not supported", "tools")
    if body.response_format and body.response_format.get("type") != "text":
        raise RequestError("response_format other than text is not supported", "response_format")
    if body.top_logprobs and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs = true", "top_logprobs")
    name, max_tokens = ("max_completion_tokens", body.max_completion_tokens)
    if max_tokens is None:
        name, max_tokens = "max_tokens", body.max_tokens
    params = body.sampling_params(st.context_len if max_tokens is None else max_tokens) | {"n": body.n}
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    reqs = st.requests([_chat_prompt(body, st)], params, rid, body.logprobs, body.top_logprobs or 0, name)
    group = await st.client.submit(reqs, rid, body.stream)
    reply = _Reply(st, group, body.n, chat=True, include_usage=body.include_usage)
    return await reply.respond(request, body.stream)


def _chat_prompt(body: ChatCompletionRequest, st: Served) -> list[int]:
    tok = st.need_tokenizer("chat")
    messages = []
    for m in body.messages:
        content = m.content or ""
        if isinstance(content, list):
            other = [p.type for p in content if p.type != "text"]
            if other:
                raise RequestError(f"content parts of type {other[0]!r} are not supported (text only)", "messages")
            content = "".join(p.text or "" for p in content)
        messages.append({"role": m.role, "content": content, **({"name": m.name} if m.name else {})})
    try:
        return tok.encode(tok.apply_chat_template(messages))
    except (TemplateError, ValueError, TypeError) as e:
        raise RequestError(f"the chat template refused these messages: {e}", "messages") from e


class _Reply:
    """Builds one OpenAI response (whole or streamed) from a group's mirror requests."""

    def __init__(self, st: Served, group: Group, n: int, chat: bool, include_usage: bool):
        self.st, self.group, self.n, self.chat, self.include_usage = st, group, n, chat, include_usage
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    async def respond(self, request: Request, stream: bool):
        if stream:
            return GroupStream(self.group, self._stream())
        try:
            await wait_or_disconnect(self.group, request)
        except ClientGone:
            return Response(status_code=499)
        for t in self.group.tracks:
            if message := internal_error(t.req):
                raise RequestError(message, status=500)
        return self._body([self._choice(i, t.req) for i, t in enumerate(self.group.tracks)], self.usage())

    def _body(self, choices: list[dict], usage: dict | None, chunk: bool = False) -> dict:
        body = {"id": self.group.id, "object": self.object + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.st.model_name, "choices": choices}
        if usage is not None or (chunk and self.include_usage):
            body["usage"] = usage
        return body

    def usage(self) -> dict:
        reqs = [t.req for t in self.group.tracks]
        prompts = [reqs[i:i + self.n] for i in range(0, len(reqs), self.n)]
        prompt = sum(len(p[0].prompt_ids) for p in prompts)
        completion = sum(len(r.output_ids) for r in reqs)
        cached = sum(max(r.cached_tokens for r in p) for p in prompts)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    # ---- whole responses
    def _choice(self, index: int, req: Req) -> dict:
        text = output_text(req, self.st.tokenizer)
        logprobs = self._logprobs(req, 0, len(req.output_ids), 0) if req.return_logprob else None
        choice = {"index": index, "logprobs": logprobs, "finish_reason": req.finish_reason["type"]}
        if req.finish_reason["type"] == "stop":
            choice["matched_stop"] = req.finish_reason.get("matched")
        if self.chat:
            return {**choice, "message": {"role": "assistant", "content": text}}
        return {**choice, "text": text}

    def _logprobs(self, req: Req, start: int, end: int, text_offset: int) -> dict:
        tok = self.st.token_str
        ids, lps = req.output_ids[start:end], [max(x, _MIN_LOGPROB) for x in req.output_logprobs[start:end]]
        tops = req.output_top_logprobs[start:end] if req.top_logprobs_num else [[] for _ in ids]
        strs = [tok(t) for t in ids]
        if self.chat:
            def entry(s, lp):
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}

            return {"content": [{**entry(s, lp), "top_logprobs": [entry(tok(t), max(x, _MIN_LOGPROB)) for t, x in top]}
                                for s, lp, top in zip(strs, lps, tops)]}
        offsets = []
        for s in strs:
            offsets.append(text_offset)
            text_offset += len(s)
        return {"tokens": strs, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": [{tok(t): max(x, _MIN_LOGPROB) for t, x in top} for top in tops]}

    # ---- streams
    async def _stream(self):
        texts = [TextStream(t.req, self.st.tokenizer) for t in self.group.tracks]
        done = [False] * len(texts)
        try:
            if self.chat:
                yield sse(self._body([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None} for i in range(len(texts))], None, chunk=True))
            async for _ in self.group.changes():
                for i, ts in enumerate(texts):
                    if done[i]:
                        continue
                    if message := internal_error(ts.req):
                        yield sse(error_body(500, message))
                        yield DONE
                        return
                    chunk = self._chunk(i, ts)
                    if chunk is not None:
                        yield sse(chunk)
                    done[i] = ts.req.finished
            if self.include_usage:
                yield sse(self._body([], self.usage(), chunk=True))
            yield DONE
        except EngineDead as e:
            yield sse(error_body(503, str(e)))
            yield DONE

    def _chunk(self, index: int, ts: TextStream) -> dict | None:
        offset = ts.sent
        delta, start, end = ts.advance()
        req, reason = ts.req, ts.req.finish_reason
        want_lp = req.return_logprob and end > start
        if not delta and reason is None and not want_lp:
            return None
        choice = {"index": index, "logprobs": self._logprobs(req, start, end, offset) if want_lp else None,
                  "finish_reason": None if reason is None else reason["type"]}
        if reason is not None and reason["type"] == "stop":
            choice["matched_stop"] = reason.get("matched")
        if self.chat:
            choice["delta"] = {"content": delta} if delta or reason is None else {}
        else:
            choice["text"] = delta
        return self._body([choice], None, chunk=True)
