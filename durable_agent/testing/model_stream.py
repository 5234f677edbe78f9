"""The scripted model server's streamed answers: server-sent events as OpenAI sends them.

A Chat Completions request with ``"stream": true`` is answered with ``chat.completion.chunk``
events: the role, then the content (or each tool call's name, then its arguments) in pieces
of ``piece_chars`` characters, then the finish reason, then (with ``stream_options:
{"include_usage": true}``) one chunk with no choices and the usage, then ``data: [DONE]``.
A Responses request with ``"stream": true`` gets ``response.*`` events ending in
``response.completed`` with the whole response. Between two events the server waits
``chunk_seconds``, and ``StreamGate`` can stop every stream in flight after a number of
pieces of text until it is released (to kill a worker mid-stream).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

JsonDict = dict[str, Any]

__all__ = ["StreamGate", "chat_chunks", "pieces", "sse"]


def sse(data: JsonDict | str, event: str | None = None) -> bytes:
    """One server-sent event."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def pieces(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of ``size`` characters (at least one piece)."""
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class StreamGate:
    """Holds the streams in flight after ``after`` pieces of text (of content, not of a tool
    call's arguments) until :meth:`release`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._after: int | None = None
        self._closed = False
        self.waiting = 0

    def hold(self, after: int) -> None:
        with self._cond:
            self._after = after

    def release(self) -> None:
        with self._cond:
            self._after = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._after = None
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._closed = False

    def at_piece(self, sent: int) -> None:
        """Called after each piece of text; blocks while the gate holds at this count."""
        with self._cond:
            if self._after is None or sent != self._after or self._closed:
                return
            self.waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._after is None or self._closed)
            finally:
                self.waiting -= 1

    def wait_for_waiting(self, n: int = 1, timeout: float = 5.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.waiting >= n, timeout=timeout):
                raise TimeoutError(f"expected {n} stream(s) held within {timeout}s")


def chat_chunks(
    completion: JsonDict,
    *,
    include_usage: bool,
    piece_chars: int,
    pause: Callable[[], None],
    gate: StreamGate,
    cut: bool = False,
) -> Iterator[bytes]:
    """The SSE stream of a Chat Completions answer (``cut``: stop halfway, as a dropped
    connection does, without a finish reason or ``[DONE]``)."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: JsonDict, finish: str | None = None) -> bytes:
        part = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return sse({**head, "choices": [part]})

    yield chunk({"role": "assistant", "content": ""})
    texts = pieces(message["content"], piece_chars) if message.get("content") else []
    for sent, text in enumerate(texts, start=1):
        pause()
        yield chunk({"content": text})
        gate.at_piece(sent)
        if cut and sent >= len(texts) // 2:
            return
    for index, call in enumerate(message.get("tool_calls") or []):
        pause()
        if call.get("type") != "function":
            yield chunk({"tool_calls": [{"index": index, **call}]})
            continue
        function = call["function"]
        first = {"name": function["name"], "arguments": ""}
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": first}]})  # fmt: skip
        for text in pieces(function["arguments"], piece_chars):
            pause()
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
    if cut:
        return
    pause()
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield sse({**head, "choices": [], "usage": completion["usage"]})
    yield sse("[DONE]")
