"""A streamed Chat Completions answer, put back together into the message we journal.

The request goes out with ``stream=True`` and ``stream_options={"include_usage": true}``:
the text of each chunk is handed to ``on_delta`` as it arrives (the watchers' tokens), the
tool calls are assembled from their pieces by index, and the last chunk's ``usage`` is
kept, so the spend ledger counts a streamed call exactly as an unstreamed one. A stream that
ends before its finish reason (the connection dropped, the server died) is a failed call,
retried as a 5xx is: nothing of it is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ModelUnavailable

DeltaSink = Callable[[str], None]
"""Given each piece of the answer's text as it arrives."""

__all__ = ["DeltaSink", "StreamedAnswer", "with_usage"]


def with_usage(request: dict[str, Any]) -> dict[str, Any]:
    """The request as sent when streamed: asking for the usage in the last chunk."""
    options = dict(request.get("stream_options") or {})
    options.setdefault("include_usage", True)
    return {**request, "stream": True, "stream_options": options}


class StreamedAnswer:
    """The pieces of one streamed answer, gathered as they come."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0

    def read(self, chunks: Iterable[Any], on_delta: DeltaSink | None) -> StreamedAnswer:
        for chunk in chunks:
            self.chunks += 1
            self.model = getattr(chunk, "model", None) or self.model
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self.usage = usage.model_dump()
            for choice in getattr(chunk, "choices", None) or []:
                if getattr(choice, "index", 0) != 0:
                    continue
                delta = choice.delta
                if delta is not None and delta.content:
                    self.content.append(delta.content)
                    if on_delta is not None:
                        on_delta(delta.content)
                for call in (delta.tool_calls if delta is not None else None) or []:
                    self._add_call(call)
                if choice.finish_reason:
                    self.finish_reason = choice.finish_reason
        return self

    def _add_call(self, piece: Any) -> None:
        call = self.calls.setdefault(piece.index, {"id": None, "type": None, "function": {}})
        if piece.id:
            call["id"] = piece.id
        if piece.type:
            call["type"] = piece.type
        function = getattr(piece, "function", None)
        if function is not None:
            if function.name:
                call["function"]["name"] = call["function"].get("name", "") + function.name
            if function.arguments:
                arguments = call["function"].get("arguments", "")
                call["function"]["arguments"] = arguments + function.arguments
        if piece.type not in (None, "function"):
            # another kind of call (e.g. 'custom'): kept as sent, as an unstreamed one is
            data = piece.model_dump(mode="json", exclude_none=True)
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
