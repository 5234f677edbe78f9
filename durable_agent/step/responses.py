"""The Responses API beside Chat Completions: the call, its journal form and its loop.

An agent chooses it with ``Agent(..., api="responses")``. A Responses request carries the
agent's instructions and an ``input`` list of items; the answer is a list of output items
(reasoning, function calls, a message). The journal records those items exactly as they
came (plain JSON), and the loop appends them, and each tool's ``function_call_output``, to
the next request's input, so a turn resumed after a crash, or replayed, sends the same
requests byte for byte, reasoning items included. ``store`` is false by default (nothing is
kept at OpenAI between calls: the journal is the conversation), so a reasoning model's items
must carry their ``encrypted_content``: the request asks for it whenever the agent's
parameters set ``reasoning``.

The journal form adds ``message`` (the text and the calls in Chat Completions form) so that
what reads a model step (``journal``, the console, the spend ledger's ``usage`` counted as
``prompt_tokens``/``completion_tokens``) needs to know only one shape.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import ModelUnavailable, TurnFailed
from ..redact import redact

if TYPE_CHECKING:
    import openai

    from .loop import TurnContext
    from .model_stream import DeltaSink

__all__ = ["call_responses", "input_items", "responses_loop"]


def responses_loop(ctx: TurnContext) -> str:
    """The built-in loop on the Responses API: call the model, run every function call of
    its answer, call it again with the outputs, until it answers without calls."""
    items = input_items(ctx.history, ctx.message)
    while True:
        response = ctx.model({"input": list(items)}, stream=ctx.streaming)
        items.extend(response["output"])
        calls = [item for item in response["output"] if item.get("type") == "function_call"]
        if not calls:
            return str(response["message"].get("content") or "")
        for call in calls:
            content = ctx.tool_call(
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": content}
            )


def input_items(history: list[tuple[str, str]], message: str) -> list[dict[str, Any]]:
    """The input before this turn's first call: the session's earlier (message, reply)
    pairs, then this turn's message (the instructions go in ``instructions``)."""
    items: list[dict[str, Any]] = []
    for earlier_message, earlier_reply in history:
        items.append({"role": "user", "content": earlier_message})
        items.append({"role": "assistant", "content": earlier_reply})
    items.append({"role": "user", "content": message})
    return items


def call_responses(
    client: openai.OpenAI, request: dict[str, Any], on_delta: DeltaSink | None, where: str
) -> dict[str, Any]:
    """One Responses call (streamed when the request says so); its journal form."""
    if not request.get("stream"):
        return _journal_form(client.responses.create(**request), where)
    completed: Any = None
    with client.responses.create(**request) as events:
        for event in events:
            kind = getattr(event, "type", "")
            if kind == "response.output_text.delta" and on_delta is not None:
                on_delta(event.delta)
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                completed = event.response
            elif kind == "error":
                raise ModelUnavailable(
                    f"the model API at {where} sent an error in the stream: "
                    f"{redact(str(getattr(event, 'message', event)))[:200]}"
                )
    if completed is None:
        raise ModelUnavailable(
            f"the model API at {where} ended the stream before the response was completed"
        )
    return _journal_form(completed, where)


def _journal_form(response: Any, where: str) -> dict[str, Any]:
    status = getattr(response, "status", None)
    output = getattr(response, "output", None)
    if not isinstance(output, list):
        raise ModelUnavailable(
            f"the model API at {where} answered with a body that is not a response: "
            f"{redact(str(response))[:120]!r}"
        )
    if status == "failed":
        error = getattr(response, "error", None)
        raise ModelUnavailable(f"the model API at {where} failed the response: {error}")
    items = [item.model_dump(mode="json", exclude_none=True) for item in output]
    text = "".join(
        part.get("text", "")
        for item in items
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments", "")},
        }
        for item in items
        if item.get("type") == "function_call"
    ]
    if not calls and not text:
        details = getattr(response, "incomplete_details", None)
        reason = getattr(details, "reason", None)
        if reason == "content_filter":
            raise TurnFailed("the model's answer was withheld by its content filter")
        if reason == "max_output_tokens":
            raise TurnFailed("the model reached its token limit before it answered anything")
        raise ModelUnavailable(
            f"the model API at {where} returned a response with neither text nor function calls"
        )
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return {
        "output": items,
        "message": message,
        "status": status,
        "model": getattr(response, "model", None),
        "usage": _usage(getattr(response, "usage", None)),
    }


def _usage(usage: Any) -> dict[str, Any] | None:
    """The Responses usage, with the Chat Completions names the spend ledger reads."""
    if usage is None:
        return None
    data: dict[str, Any] = json.loads(usage.model_dump_json())
    data["prompt_tokens"] = data.get("input_tokens", 0)
    data["completion_tokens"] = data.get("output_tokens", 0)
    return data
