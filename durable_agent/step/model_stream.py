"""A streamed Chat Completions answer, put back together into the message we journal.

The request goes out with ``stream=True`` and ``stream_options={"include_usage": true}``:
the text of each chunk is handed to ``on_delta`` as it arrives (the watchers' tokens), the
tool calls are assembled from their pieces by index, and the last chunk's ``usage`` is
kept, so the spend ledger counts a streamed call exactly as an unstreamed one. A stream that
ends before its finish reason (the connection dropped, the server died) is a failed call,
retried as a 5xx is: nothing of it is recorded.

The events are read as plain JSON (:func:`chunks_of`), not as the SDK's chunk objects:
building a pydantic object per chunk cost about 0.06 ms a chunk, some 4 ms a turn of three
short answers, more than the rest of the turn's Python (``python -m bench timeline``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import openai
import pydantic
from openai.types import CompletionUsage

from ..errors import ModelUnavailable

DeltaSink = Callable[[str], None]
"""Given each piece of the answer's text as it arrives."""

__all__ = ["DeltaSink", "StreamedAnswer", "chunks_of", "with_usage"]


def with_usage(request: dict[str, Any]) -> dict[str, Any]:
    """The request as sent when streamed: asking for the usage in the last chunk."""
    options = dict(request.get("stream_options") or {})
    options.setdefault("include_usage", True)
    return {**request, "stream": True, "stream_options": options}


def chunks_of(lines: Iterable[str], request: Any = None) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, given its lines, up to ``[DONE]``. An
    event that carries an ``error`` raises ``openai.APIError``, as the SDK's own stream does;
    one that is not JSON raises ``json.JSONDecodeError``."""
    data: list[str] = []
    for line in _ended(lines):
        if line:
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value[1:] if value.startswith(" ") else value)
            continue
        if not data:
            continue
        payload, data = "\n".join(data), []
        if payload.startswith("[DONE]"):
            return
        chunk = json.loads(payload)
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise openai.APIError(
                message
                if isinstance(message, str) and message
                else "An error occurred during streaming",
                request,
                body=error,
            )
        yield chunk


def _ended(lines: Iterable[str]) -> Iterator[str]:
    yield from lines
    yield ""  # the last event, if the stream ended without its blank line


class StreamedAnswer:
    """The pieces of one streamed answer, gathered as they come."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0

    def read(self, chunks: Iterable[dict[str, Any]], on_delta: DeltaSink | None) -> StreamedAnswer:
        """Gather the chunks (JSON objects, see :func:`chunks_of`)."""
        for chunk in chunks:
            self.chunks += 1
            if not isinstance(chunk, dict):
                continue
            self.model = chunk.get("model") or self.model
            usage = chunk.get("usage")
            if usage is not None:
                self.usage = _usage(usage)
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    self.content.append(text)
                    if on_delta is not None:
                        on_delta(text)
                for call in delta.get("tool_calls") or []:
                    self._add_call(call)
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        return self

    def _add_call(self, piece: dict[str, Any]) -> None:
        call = self.calls.setdefault(
            piece.get("index", 0), {"id": None, "type": None, "function": {}}
        )
        if piece.get("id"):
            call["id"] = piece["id"]
        kind = piece.get("type")
        if kind:
            call["type"] = kind
        function = piece.get("function")
        if function is not None:
            if function.get("name"):
                call["function"]["name"] = call["function"].get("name", "") + function["name"]
            if function.get("arguments"):
                arguments = call["function"].get("arguments", "")
                call["function"]["arguments"] = arguments + function["arguments"]
        if kind not in (None, "function"):
            # another kind of call (e.g. 'custom'): kept as sent, as an unstreamed one is
            data = _without_nones(piece)
            data.pop("index", None)
            call.clear()
            call.update(data)

    def parts(self, where: str) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """(content, tool calls, finish reason); ModelUnavailable for a stream cut short."""
        if self.finish_reason is None:
            if not self.chunks:
                raise ModelUnavailable(
                    f"the model API at {where} answered 200 with a body that is not a stream "
                    "of completion chunks"
                )
            raise ModelUnavailable(
                f"the model API at {where} ended the stream before the answer was finished "
                f"(after {self.chunks} chunks, no finish reason)"
            )
        calls = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if call.get("type") in (None, "function"):
                function = call["function"]
                call = {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": function.get("name", ""),
                        "arguments": function.get("arguments", ""),
                    },
                }
            calls.append(call)
        content = "".join(self.content) if self.content else None
        return content, calls, self.finish_reason


def _usage(usage: Any) -> Any:
    """The usage as an unstreamed answer's is journaled (the SDK's fields, None if absent)."""
    try:
        return CompletionUsage.model_validate(usage).model_dump()
    except pydantic.ValidationError:
        return usage


def _without_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nones(v) for v in value]
    return value
