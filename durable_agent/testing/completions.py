"""What the scripted model server answers with: a completion built from the policy's
message, an OpenAI error, or one of the malformed answers real endpoints sometimes send."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from durable_agent.testing.http import HttpResponse
from durable_agent.testing.model_stream import StreamGate, chat_chunks, sse

JsonDict = dict[str, Any]


def canonical_request(body: JsonDict) -> str:
    """The canonical text of a request: its model, messages and tools as sorted compact JSON
    (a Responses request: its instructions and input too).

    Two requests with the same canonical text are the same model call; everything else in the
    body (temperature, headers, ``stream``...) is ignored.
    """
    key = {"model": body.get("model"), "messages": body.get("messages"), "tools": body.get("tools")}
    if "input" in body:  # a Responses request
        key.update(instructions=body.get("instructions"), input=body["input"])
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def reply(content: str) -> JsonDict:
    """A final assistant message with text and no tool calls."""
    return {"role": "assistant", "content": content}


@dataclass(frozen=True)
class _Fault:
    status: int
    retry_after: float | None
    kind: str = "error"


MALFORMED = {
    "html": "a 200 whose body is an HTML page (a proxy's error page)",
    "truncated": "a 200 whose JSON body is cut off",
    "empty-message": "a completion whose message has no content and no tool calls",
    "no-choices": "a completion with an empty choices list",
    "custom-tool-call": "a completion calling a tool of type 'custom'",
}
"""What `answer_next_malformed(kind)` can send instead of a proper completion."""


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def _openai_error(
    status: int, message: str, *, headers: dict[str, str] | None = None
) -> HttpResponse:
    error_type, code = _ERROR_TYPES.get(status, ("server_error", None))
    payload = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return HttpResponse(status, payload, headers or {})


def _malformed(kind: str, body: JsonDict, digest: str, *, stream: bool) -> HttpResponse:
    if stream and kind == "truncated":  # the connection drops halfway through the stream
        cut_off = _completion(body, reply("a reply that is cut off halfway"), digest)
        chunks = chat_chunks(
            cut_off, include_usage=True, piece_chars=4, pause=lambda: None, gate=StreamGate(),
            cut=True,
        )  # fmt: skip
        return HttpResponse(200, None, chunks=chunks)
    if stream and kind != "html":
        answer = _malformed(kind, body, digest, stream=False).payload
        answer.setdefault("usage", None)
        if not answer["choices"]:
            chunks = iter([sse({**answer, "object": "chat.completion.chunk"}), sse("[DONE]")])
            return HttpResponse(200, None, chunks=chunks)
        chunks = chat_chunks(
            answer, include_usage=True, piece_chars=4, pause=lambda: None, gate=StreamGate()
        )
        return HttpResponse(200, None, chunks=chunks)
    if kind == "html":
        page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        return HttpResponse(200, None, {"Content-Type": "text/html"}, raw=page)
    if kind == "truncated":
        whole = json.dumps(_completion(body, {"role": "assistant", "content": "x"}, digest))
        return HttpResponse(200, None, raw=whole[: len(whole) // 2].encode())
    if kind == "no-choices":
        return HttpResponse(200, {**_completion(body, reply(""), digest), "choices": []})
    if kind == "custom-tool-call":
        call = {"id": "call_custom", "type": "custom", "custom": {"name": "x", "input": "y"}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return HttpResponse(200, _completion(body, message, digest))
    return HttpResponse(200, _completion(body, {"role": "assistant", "content": None}, digest))


def _normalise_message(answer: Any, n_messages: int) -> JsonDict:
    """Validate a policy's answer and fill in deterministic tool call ids."""
    if not isinstance(answer, dict):
        raise TypeError(f"policy must return a dict, got {type(answer).__name__}")
    content = answer.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("policy answer 'content' must be a string or None")
    message: JsonDict = {"role": "assistant", "content": content}
    calls = answer.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            _normalise_call(call, f"call_{n_messages}_{index}") for index, call in enumerate(calls)
        ]
    elif content is None:
        raise ValueError("policy answer needs 'content' or 'tool_calls'")
    return message


def _normalise_call(call: JsonDict, default_id: str) -> JsonDict:
    function = call.get("function") or {}
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool call without a function name: {call!r}")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, separators=(",", ":"))
    return {
        "id": call.get("id") or default_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _completion(body: JsonDict, message: JsonDict, digest: str) -> JsonDict:
    """Build a ChatCompletion whose every byte is a function of the request. Its ``usage``
    counts about four characters a token, as OpenAI's tokenizers do for English: the
    canonical request for the prompt, the message for the completion."""
    prompt_tokens = max(1, len(canonical_request(body)) // 4)
    completion_tokens = max(1, len(json.dumps(message)) // 4)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
