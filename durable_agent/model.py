"""The model: Chat Completions with tools through the ``openai`` SDK, any compatible server.

Transient failures (429, 5xx, timeouts, refused connections) are retried by the SDK with
backoff (``DURABLE_AGENT_MODEL_MAX_RETRIES``); if they persist, :class:`ModelUnavailable`
leaves the turn resumable. A request the API rejects as malformed (400, 422) fails the turn.
"""

from __future__ import annotations

from typing import Any

import openai

from .errors import ConfigurationError, ModelUnavailable, TurnFailed
from .settings import Settings


class ModelClient:
    """Sends one Chat Completions request and returns the plain-data response we journal."""

    def __init__(self, settings: Settings) -> None:
        self.base_url = settings.openai_base_url
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

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        try:
            response = self.client.chat.completions.create(**request)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as error:
            raise TurnFailed(f"the model API rejected the request: {_message(error)}") from error
        except openai.APIStatusError as error:
            raise ModelUnavailable(
                f"the model API answered {error.status_code}: {_message(error)}"
            ) from error
        except openai.APIConnectionError as error:
            where = self.base_url or "the default OpenAI endpoint"
            raise ModelUnavailable(f"cannot reach the model API at {where}: {error}") from error
        if not response.choices:
            raise ModelUnavailable("the model API returned no choices")
        choice = response.choices[0]
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
        if choice.message.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    },
                }
                for call in choice.message.tool_calls
            ]
        return {
            "message": message,
            "finish_reason": choice.finish_reason,
            "model": response.model,
            "usage": response.usage.model_dump() if response.usage else None,
        }


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
