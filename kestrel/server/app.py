"""The FastAPI app: OpenAI routes (openai_api), SGLang's native /generate and /abort_request, /health, /metrics,
/get_model_info; an optional API key; every error as an OpenAI-style body.

Status codes: 400 for anything wrong with a request (pydantic's validation errors included, not FastAPI's 422),
401 for a missing or wrong key, 503 once the engine core is gone, 500 only for a request the engine failed.
"""

import hmac
import logging
import uuid

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from kestrel.engine.engine import output_dict
from kestrel.engine.sampling_params import InvalidRequest
from kestrel.server import openai_api
from kestrel.server.engine_client import EngineDead, Group
from kestrel.server.protocol import AbortRequest, GenerateRequest, RequestError, error_body, error_response
from kestrel.server.serving import DONE, ClientGone, GroupStream, Served, TextStream, sse, state, wait_or_disconnect

log = logging.getLogger(__name__)


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="Kestrel", description="OpenAI-compatible and SGLang-native serving of K3-style models")
    app.state.served = served
    for exc, handler in _HANDLERS.items():
        app.add_exception_handler(exc, handler)

    @app.get("/health")
    async def health(request: Request):
        client = state(request).client
        if not client.alive:
            return error_response(503, client.dead or "the engine core is not running")
        return {"status": "ok"}

    guarded = APIRouter(dependencies=[Depends(_check_key)])
    guarded.include_router(openai_api.router)
    guarded.include_router(native)
    app.include_router(guarded)
    app.add_middleware(_JSONBodies)
    return app


class _JSONBodies:
    """Read every POST body as JSON whatever its Content-Type (curl -d sends form-encoded), as SGLang does."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _check_key(request: Request) -> None:
    key = state(request).args.api_key
    if key is None:
        return
    sent = request.headers.get("authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
        raise RequestError("a valid API key is needed: send 'Authorization: Bearer KEY'", status=401)


# ---- errors
def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    parts, param = [], None
    for e in errors[:3]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        if e.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))})")
            continue
        if not loc and e.get("type") == "missing":
            parts.append("the body is empty: send a JSON object")
            continue
        param = param or (loc[0] if loc else None)
        parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg')} (got {_short(e.get('input'))})")
    return error_response(400, "; ".join(parts) or "invalid request", param)


def _short(value) -> str:
    s = repr(value)
    return s if len(s) <= 80 else s[:77] + "..."


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


_HANDLERS = {
    RequestValidationError: _validation_error,
    RequestError: lambda request, exc: error_response(exc.status, exc.message, exc.param),
    InvalidRequest: lambda request, exc: error_response(400, str(exc)),
    EngineDead: lambda request, exc: error_response(503, str(exc)),
    HTTPException: lambda request, exc: JSONResponse(error_body(exc.status_code, str(exc.detail)),
                                                     status_code=exc.status_code, headers=exc.headers),
    Exception: _internal_error,
}


# ---- SGLang's native API
native = APIRouter()


@native.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    """SGLang's /generate: text or input_ids (one or a batch), sampling_params (one or one per prompt); answers
    kestrel.engine.engine.output_dict per request (a list unless a single prompt with n = 1)."""
    st = state(request)
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("pass exactly one of text and input_ids", "text")
    if body.text is not None:
        tok = st.need_tokenizer("text")
        single = isinstance(body.text, str)
        prompts = [tok.encode(t) for t in ([body.text] if single else body.text)]
    else:
        single = not body.input_ids or isinstance(body.input_ids[0], int)
        prompts = [body.input_ids] if single else body.input_ids
    params = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params] * len(prompts)
    if len(params) != len(prompts):
        raise RequestError(f"{len(params)} sampling_params for {len(prompts)} prompts", "sampling_params")
    if not prompts:
        raise RequestError("no prompt", "text")
    names = [body.rid] if isinstance(body.rid, str) else body.rid or []
    if not all(names):
        raise RequestError("a rid must be a non-empty string", "rid")
    group_id = body.rid if isinstance(body.rid, str) else uuid.uuid4().hex
    reqs = []
    for ids, p in zip(prompts, params):
        reqs += st.requests([ids], dict(p or {}), group_id, body.return_logprob, body.top_logprobs_num,
                            "max_new_tokens")
    _name_requests(reqs, body.rid, group_id)
    group = await st.client.submit(reqs, group_id, body.stream)
    if body.stream:
        return GroupStream(group, _generate_stream(st, group))
    try:
        await wait_or_disconnect(group, request)
    except ClientGone:
        return Response(status_code=499)
    outs = [output_dict(t.req, st.tokenizer, i) for i, t in enumerate(group.tracks)]
    return outs[0] if single and len(outs) == 1 else outs


def _name_requests(reqs, rid, group_id: str) -> None:
    """The client's rids (one per request), else the group's id for a single request, else group-id-k."""
    for k, r in enumerate(reqs):
        r.rid = f"{group_id}-{k}"
    if isinstance(rid, list):
        if len(rid) != len(reqs):
            raise RequestError(f"{len(rid)} rids for {len(reqs)} requests", "rid")
        for r, name in zip(reqs, rid):
            r.rid = name
    elif len(reqs) == 1:
        reqs[0].rid = group_id


async def _generate_stream(st: Served, group: Group):
    """Cumulative output dicts, one per request that changed, as the offline Engine's stream gives them."""
    texts = [TextStream(t.req, st.tokenizer) for t in group.tracks]
    seen = [-1] * len(group.tracks)
    try:
        async for _ in group.changes():
            for i, (t, ts) in enumerate(zip(group.tracks, texts)):
                progress = len(t.req.output_ids) + (1 if t.finished else 0)
                if progress == seen[i]:
                    continue
                seen[i] = progress
                ts.advance()
                if t.finished or t.req.return_logprob:
                    yield sse(output_dict(t.req, st.tokenizer, i))
                else:
                    # the text so far from the incremental decoder, not a decode of every token each time
                    yield sse({**output_dict(t.req, None, i), "text": ts.text[: ts.sent]})
        yield DONE
    except EngineDead as e:
        yield sse(error_body(503, str(e)))
        yield DONE


@native.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict:
    client = state(request).client
    if body.abort_all:
        ids = list(client.groups)
        for gid in ids:
            client.abort_group_or_request(gid)
        return {"aborted": len(ids)}
    return {"aborted": int(client.abort_group_or_request(body.rid))}


@native.get("/get_model_info")
async def model_info(request: Request) -> dict:
    st = state(request)
    return {"model_path": st.args.model_path, "served_model_name": st.model_name, "context_length": st.context_len,
            "vocab_size": st.vocab_size, "has_tokenizer": st.tokenizer is not None, "is_generation": True}


@native.get("/metrics")
async def metrics(request: Request) -> Response:
    st = state(request)
    if not st.args.enable_metrics:
        raise RequestError("metrics are off (--enable-metrics)", status=404)
    snapshot = await st.client.core_metrics()
    return Response(st.client.metrics.render(snapshot), media_type=CONTENT_TYPE_LATEST)
