"""Request bodies (pydantic, strict types) and the OpenAI error shape.

OpenAI endpoints ignore fields they do not know (clients send many optional ones) but refuse the ones they know
and cannot honour; SGLang's /generate refuses unknown sampling parameters (SamplingParams.from_dict does).
Numeric ranges are checked here under the OpenAI names so that a 400 names the field the client sent; the engine
core checks everything again and stays the authority.
"""

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 503: "service_unavailable"}


class RequestError(Exception):
    """An error for the client, turned into an OpenAI-style error body with this status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "internal_error"), "param": param,
                      "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    """What completions and chat share: the OpenAI sampling fields plus SGLang's extensions (via extra_body)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # SGLang's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    def sampling_params(self, max_new_tokens: int) -> dict:
        """The engine's sampling_params (SGLang names) for one choice."""
        if self.logit_bias:
            raise RequestError("logit_bias is not supported", "logit_bias")
        d = {"max_new_tokens": max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
             "seed": self.seed, "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
             "top_k": self.top_k, "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
             "min_new_tokens": self.min_tokens, "stop": self.stop, "stop_token_ids": self.stop_token_ids,
             "ignore_eos": self.ignore_eos, "skip_special_tokens": self.skip_special_tokens,
             "no_stop_trim": self.no_stop_trim}
        return {k: v for k, v in d.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


class GenerateRequest(_Body):
    """SGLang's /generate body."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=20)
    rid: str | list[str] | None = None


class AbortRequest(_Body):
    rid: str = ""
    abort_all: bool = False

