"""The model: Chat Completions with tools through the ``openai`` SDK, any compatible server.

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

from ..errors import ConfigurationError, ModelUnavailable, TurnFailed
from ..redact import redact
from ..settings import Settings

_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_CONFIGURATION = {
    401: "the model API refused the key (check OPENAI_API_KEY)",
    403: "the model API does not allow this key to use it (check OPENAI_API_KEY and the model)",
    404: "the model API does not know this model or URL (check DURABLE_AGENT_MODEL and "
    "OPENAI_BASE_URL)",
    413: "the model API refused a request this large (the conversation is too long)",
}


class ModelClient:
    """Sends one Chat Completions request and returns the plain-data response we journal."""

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

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        try:
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
        return _journal_form(response, self.where)


def _status_error(error: openai.APIStatusError) -> Exception:
    status = error.status_code
    text = redact(_message(error))
    if status in _CONFIGURATION:
        return TurnFailed(f"{_CONFIGURATION[status]}: {status} {text}")
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
    message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    calls = choice.message.tool_calls or []
    if calls:
        message["tool_calls"] = [_tool_call(call) for call in calls]
    elif not choice.message.content:
        if choice.finish_reason == "content_filter":
            raise TurnFailed("the model's answer was withheld by its content filter")
        if choice.finish_reason == "length":
            raise TurnFailed("the model reached its token limit before it answered anything")
        raise ModelUnavailable(
            f"the model API at {where} returned a message with neither content nor tool calls"
        )
    return {
        "message": message,
        "finish_reason": choice.finish_reason,
        "model": response.model,
        "usage": response.usage.model_dump() if response.usage else None,
    }


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

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        raise TurnFailed(
            f"replay needed a model call ({len(request['messages'])} messages): "
            "the journal has no finished model call for this step"
        )


def _message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error)
