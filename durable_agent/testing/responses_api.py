"""The scripted model server's Responses API (``POST /v1/responses``).

The policy is written for Chat Completions, so a Responses request is shown to it as the
Chat Completions request it amounts to (:func:`chat_view`: the instructions as the system
message, input messages, ``function_call`` items as an assistant's tool calls,
``function_call_output`` items as tool messages; reasoning items are not shown), and its
answer is sent back as Responses output items (:func:`response_object`): a reasoning item
first when the server is asked to reason (with an ``encrypted_content`` that a later request
must send back, as OpenAI's reasoning models with ``store=false`` require), then the
function calls or the message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .model_stream import StreamGate, pieces, sse

JsonDict = dict[str, Any]

__all__ = ["chat_view", "response_events", "response_object"]


def chat_view(body: JsonDict) -> JsonDict:
    """The Chat Completions request a Responses request amounts to (for the policy)."""
    messages: list[JsonDict] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _text(item)})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters") if k in t},
        }
        for t in body.get("tools") or []
        if t.get("type") == "function"
    ]
    view: JsonDict = {"model": body.get("model"), "messages": messages}
    if tools:
        view["tools"] = tools
    return view


def _text(item: JsonDict) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content or [] if isinstance(part, dict))


def response_object(
    body: JsonDict, message: JsonDict, digest: str, usage: JsonDict, *, reasoning: bool
) -> JsonDict:
    """The whole Response for the policy's ``message``; every byte a function of the request."""
    output: list[JsonDict] = []
    if reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{digest[:24]}",
                "summary": [{"type": "summary_text", "text": "Thinking about the request."}],
                "encrypted_content": f"enc-{digest}",
            }
        )
    for index, call in enumerate(message.get("tool_calls") or []):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{digest[:20]}_{index}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    if not message.get("tool_calls"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{digest[:24]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    return {
        "id": f"resp_{digest[:24]}",
        "object": "response",
        "created_at": 0,
        "model": body["model"],
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 8 if reasoning else 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def response_events(
    response: JsonDict, *, piece_chars: int, pause: Callable[[], None], gate: StreamGate
) -> Iterator[bytes]:
    """The SSE stream of a Response: created, each output item (a message's text in
    ``response.output_text.delta`` pieces), completed."""
    sequence = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        sequence += 1
        return sse({"type": kind, "sequence_number": sequence, **fields}, kind)

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    sent = 0
    for index, item in enumerate(response["output"]):
        pause()
        if item["type"] != "message":
            yield event("response.output_item.added", output_index=index, item=item)
            yield event("response.output_item.done", output_index=index, item=item)
            continue
        empty = {**item, "status": "in_progress", "content": []}
        yield event("response.output_item.added", output_index=index, item=empty)
        for text in pieces(item["content"][0]["text"], piece_chars):
            pause()
            yield event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
            sent += 1
            gate.at_piece(sent)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)
