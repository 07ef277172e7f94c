"""What every endpoint shares: the served model's facts, turning prompts into engine requests, waiting for a
response's requests while watching the client, server-sent events, and streamed text with stop strings held back."""

import asyncio
import dataclasses
import json
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import StreamingResponse

from kestrel.config import ServerArgs
from kestrel.engine.request import Req
from kestrel.engine.sampling_params import SamplingParams
from kestrel.server.engine_client import EngineClient, Group
from kestrel.server.protocol import RequestError
from kestrel.tokenizer import Tokenizer

DONE = b"data: [DONE]\n\n"


@dataclass
class Served:
    args: ServerArgs
    client: EngineClient
    model_name: str
    context_len: int
    vocab_size: int
    tokenizer: Tokenizer | None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise RequestError(f"model {model!r} is not served here; this server serves {self.model_name!r}", "model")

    def need_tokenizer(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise RequestError(f"{what} needs a tokenizer, and this server runs without one (--skip-tokenizer-init): "
                               f"send token ids")
        return self.tokenizer

    def token_str(self, token: int) -> str:
        return self.tokenizer.decode([token], False) if self.tokenizer else f"token_id:{token}"

    def requests(self, prompts: list[list[int]], params: dict, rid_prefix: str, return_logprob: bool = False,
                 top_logprobs_num: int = 0, max_tokens_name: str = "max_tokens") -> list[Req]:
        """Mirror requests for the prompts, each fanned out into `n` choices whose seeds are seed + i (as the
        offline Engine does). Cheap checks here; the core makes the rest."""
        sp = SamplingParams.from_dict(params)
        if sp.max_new_tokens > self.context_len:
            raise RequestError(f"{max_tokens_name} = {sp.max_new_tokens} is more than the context length "
                               f"{self.context_len}", max_tokens_name)
        if not prompts:
            raise RequestError("the prompt is empty", "prompt")
        reqs = []
        for ids in prompts:
            for i in range(sp.n):
                child = dataclasses.replace(sp, n=1, seed=None if sp.seed is None else sp.seed + i)
                reqs.append(Req(f"{rid_prefix}-{len(reqs)}", list(ids), child, 0, 0, return_logprob,
                                top_logprobs_num))
        return reqs


def state(request: Request) -> Served:
    return request.app.state.served


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class GroupStream(StreamingResponse):
    """Server-sent events of a group's requests; whatever ends the response early (a client that went away, even
    before the first event) aborts the requests still running."""

    def __init__(self, group: Group, events):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.group = group

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.group.finished:
                self.group.abort()


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) response was ready."""


async def wait_or_disconnect(group: Group, request: Request) -> None:
    """Wait until the group's requests finish; a client that disconnects first aborts them (ClientGone)."""
    done = asyncio.ensure_future(group.wait())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
            group.abort()
    if done.cancelled():
        raise ClientGone()
    done.result()


async def _disconnected(request: Request) -> None:
    # the body is read: the next ASGI message of this request is its disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass


def internal_error(req: Req) -> str | None:
    """The message of a request the engine failed (not one a client aborted)."""
    reason = req.finish_reason or {}
    message = reason.get("message", "")
    return message if reason.get("type") == "abort" and message.startswith("internal error") else None


class TextStream:
    """A choice's text as deltas: incremental detokenising, stop strings held back and trimmed like
    kestrel.engine.engine.output_text does for the whole text."""

    def __init__(self, req: Req, tokenizer: Tokenizer | None):
        self.req, p = req, req.params
        self.decoder = tokenizer.incremental_decoder(p.skip_special_tokens) if tokenizer else None
        self.stops = [] if p.no_stop_trim else p.stop
        self.read = 0  # output tokens taken
        self.text, self.sent = "", 0

    def advance(self) -> tuple[str, int, int]:
        """(new text, first and past-last index of the new tokens)."""
        r, p = self.req, self.req.params
        start, end = self.read, len(r.output_ids)
        self.read = end
        if self.decoder is None:
            return "", start, end
        ids = r.output_ids[start:end]
        reason = r.finish_reason or {}
        if reason.get("type") == "stop" and isinstance(reason.get("matched"), int) and not p.no_stop_trim and ids:
            ids = ids[:-1]
        self.text += self.decoder.push(ids)
        if r.finished:
            self.text += self.decoder.flush()
            cut = self.text.find(reason["matched"]) if isinstance(reason.get("matched"), str) else -1
            stop_at = cut if cut >= 0 and not p.no_stop_trim else len(self.text)
        else:
            stop_at = len(self.text) - _held_back(self.text, self.stops)
        delta = self.text[self.sent:stop_at]
        self.sent = max(self.sent, stop_at)
        return delta, start, end


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest tail of text that could be the start of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best

