"""The model: Chat Completions (or the Responses API, ``responses.py``) with tools through the
``openai`` SDK, any compatible server; streamed when the request asks (``model_stream.py``).

What each answer of the endpoint leads to:

=====================================================  ==========================================
the endpoint answers                                   the turn
=====================================================  ==========================================
429, 408, 409, 5xx, a refused or timed-out connection   retried by the SDK with backoff
                                                       (``DURABLE_AGENT_MODEL_MAX_RETRIES``);
                                                       then :class:`ModelUnavailable`: queued again
                                                       with the error, retried after a backoff
a 200 that is not a completion: an HTML page, cut-off  the same as a 5xx (a proxy in front of the
JSON, no choices, a message with neither content nor   endpoint, or the endpoint itself, failing)
tool calls
401, 403 (the key), 404 (the model or the URL), 413    fails at once with the reason: a
(the conversation is too large), 400 and 422 (the      configuration or a request problem, which
request), any other 4xx                                retrying cannot fix
an empty message the content filter withheld, or one   fails with the reason
cut off by the token limit
a tool call of another type than ``function``          recorded; the model is told it cannot run
=====================================================  ==========================================

Error text from the endpoint has credentials stripped before it is stored or logged.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from ..errors import ConfigurationError, ModelRateLimited, ModelUnavailable, TurnFailed
from ..redact import redact
from ..settings import Settings
from .model_stream import DeltaSink, StreamedAnswer, chunks_of, with_usage
from .responses import call_responses


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP library's own error class, which a stream broken off halfway raises through
    the SDK: ``httpx2`` for the openai SDK's recent releases, ``httpx`` for older ones.
    Neither is ours to depend on: the SDK brings the one it uses, loaded by now."""
    import sys

    modules = (sys.modules.get(name) for name in ("httpx2", "httpx"))
    return tuple(module.HTTPError for module in modules if module is not None)


_TRANSPORT_ERRORS = _transport_errors()
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_CONFIGURATION = {
    401: "the model API refused the key (check OPENAI_API_KEY)",
    403: "the model API does not allow this key to use it (check OPENAI_API_KEY and the model)",
    404: "the model API does not know this model or URL (check DURABLE_AGENT_MODEL and "
    "OPENAI_BASE_URL)",
    413: "the model API refused a request this large (the conversation is too long)",
}


class ModelClient:
    """Sends one model request and returns the plain-data response we journal: a request
    with ``input`` goes to the Responses API, one with ``messages`` to Chat Completions;
    ``"stream": true`` streams it, each piece of text given to ``on_delta``."""

    streams = True  # TurnContext hands it an on_delta

    def __init__(self, settings: Settings) -> None:
        self.base_url = settings.openai_base_url
        self._where = redact(self.base_url) if self.base_url else "the default OpenAI endpoint"
        if not settings.openai_api_key and not settings.openai_base_url:
            raise ConfigurationError(
                "no model endpoint: set OPENAI_API_KEY for OpenAI, or OPENAI_BASE_URL for "
                "another OpenAI-compatible server"
            )
        self.client = openai.OpenAI(
            base_url=settings.openai_base_url,
            # a local OpenAI-compatible server usually needs no key; the SDK insists on one
            api_key=settings.openai_api_key or "unused",
            max_retries=settings.model_max_retries,
            timeout=settings.model_timeout_seconds,
        )
        self.calls = 0

    @property
    def where(self) -> str:
        return self._where

    def __call__(
        self, request: dict[str, Any], on_delta: DeltaSink | None = None
    ) -> dict[str, Any]:
        self.calls += 1
        try:
            if "input" in request:
                return call_responses(self.client, request, on_delta, self.where)
            if request.get("stream"):
                create = self.client.chat.completions.with_streaming_response.create
                with create(**with_usage(request)) as streamed:
                    chunks = chunks_of(streamed.iter_lines(), streamed.http_request)
                    answer = StreamedAnswer().read(chunks, on_delta)
                content, calls, finish = answer.parts(self.where)
                return _checked(content, calls, finish, answer.model, answer.usage, self.where)
            response = self.client.chat.completions.create(**request)
        except openai.APIStatusError as error:
            raise _status_error(error) from error
        except openai.APIConnectionError as error:
            raise ModelUnavailable(
                f"cannot reach the model API at {self.where}: {redact(str(error))}"
            ) from error
        except (json.JSONDecodeError, openai.APIResponseValidationError) as error:
            raise ModelUnavailable(
                f"the model API at {self.where} answered 200 with a body that is not a "
                f"completion ({type(error).__name__}: {redact(str(error))[:200]})"
            ) from error
        except _TRANSPORT_ERRORS as error:  # a stream whose connection dropped halfway
            raise ModelUnavailable(
                f"the stream from the model API at {self.where} broke off: "
                f"{type(error).__name__}: {redact(str(error))[:200]}"
            ) from error
        return _journal_form(response, self.where)


def _status_error(error: openai.APIStatusError) -> Exception:
    status = error.status_code
    text = redact(_message(error))
    if status in _CONFIGURATION:
        return TurnFailed(f"{_CONFIGURATION[status]}: {status} {text}")
    if status == 429:
        return ModelRateLimited(f"the model API answered 429: {text}")
    if status in _RETRYABLE_STATUSES or status >= 500:
        return ModelUnavailable(f"the model API answered {status}: {text}")
    return TurnFailed(f"the model API rejected the request ({status}): {text}")


def _journal_form(response: Any, where: str) -> dict[str, Any]:
    """The completion as plain data, or ModelUnavailable/TurnFailed for one we cannot use."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list):
        shown = redact(str(response))[:120]
        raise ModelUnavailable(
            f"the model API at {where} answered 200 with a body that is not a completion: {shown!r}"
        )
    if not choices:
        raise ModelUnavailable(f"the model API at {where} returned no choices")
    choice = choices[0]
    calls = [_tool_call(call) for call in choice.message.tool_calls or []]
    usage = response.usage.model_dump() if response.usage else None
    return _checked(
        choice.message.content, calls, choice.finish_reason, response.model, usage, where
    )


def _checked(
    content: str | None,
    calls: list[dict[str, Any]],
    finish_reason: str | None,
    model: str | None,
    usage: dict[str, Any] | None,
    where: str,
) -> dict[str, Any]:
    """The journal form of an answer, or TurnFailed/ModelUnavailable for one we cannot use."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    elif not content:
        if finish_reason == "content_filter":
            raise TurnFailed("the model's answer was withheld by its content filter")
        if finish_reason == "length":
            raise TurnFailed("the model reached its token limit before it answered anything")
        raise ModelUnavailable(
            f"the model API at {where} returned a message with neither content nor tool calls"
        )
    return {"message": message, "finish_reason": finish_reason, "model": model, "usage": usage}


def _tool_call(call: Any) -> dict[str, Any]:
    function = getattr(call, "function", None)
    if call.type == "function" and function is not None:
        return {
            "id": call.id,
            "type": "function",
            "function": {"name": function.name, "arguments": function.arguments},
        }
    # another kind of tool call (e.g. 'custom'): kept as sent; the runner answers it with an
    # error result, as it does for an unknown tool
    data: dict[str, Any] = call.model_dump(mode="json")
    return data


class ModelSwitchedOff:
    """The model client of a replay: any call means the replay needed the model."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, request: dict[str, Any], on_delta: DeltaSink | None = None
    ) -> dict[str, Any]:
        self.calls += 1
        conversation = request.get("messages", request.get("input")) or []
        raise TurnFailed(
            f"replay needed a model call ({len(conversation)} messages): "
            "the journal has no finished model call for this step"
        )


def _message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error)
