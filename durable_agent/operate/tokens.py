"""The tokens of streamed model answers, from the worker to the watchers: a Redis stream per
turn, never Postgres.

Each entry is one event of one *attempt* of one step's model call, tagged with the step and
the claim's epoch (a new claim of the turn, after a crash or a deferral, has a higher epoch):
``start`` when the call is sent, ``delta`` with each piece of text as it arrives,
``finish`` when the answer is whole, ``abandoned`` when the call failed. The stream is
trimmed to about ``DURABLE_AGENT_TOKEN_STREAM_MAXLEN`` entries and expires
``DURABLE_AGENT_TOKEN_STREAM_TTL_SECONDS`` after its last attempt began or finished: it is a
transport, and the journal keeps only the finished answer. A Redis stream id is an offset a
watcher can go on from (``XREAD`` after it), which is what makes a stream resumable.

Entries are written by one sender thread per process, in order, in pipelines of whatever
has queued up since its last write: the thread that reads the model's stream only appends to
a queue, so a slow Redis never slows a model call, and a burst of pieces costs one round
trip. ``finish`` and ``abandon`` wait (up to ``FLUSH_SECONDS``) until the attempt's entries
are written.

The transport never fails a turn: if Redis cannot be reached, the entries are dropped
(logged once per outage) and the watchers get the finished step from the journal.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import redis

from ..settings import Settings

log = logging.getLogger(__name__)

KEY_PREFIX = "durable-agent:tokens:"
FLUSH_SECONDS = 2.0

__all__ = ["AttemptTokens", "TokenEntry", "TokenStreams", "TurnTokens"]


def stream_key(turn_id: str) -> str:
    return KEY_PREFIX + turn_id


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One entry of a turn's token stream."""

    id: str  # the Redis stream id: the offset to go on from
    step: int
    epoch: int
    kind: str  # start, delta, finish, abandoned
    text: str


class TokenStreams:
    """The Redis of the token streams: writers (:meth:`for_claim`) and the reader."""

    def __init__(self, url: str, *, maxlen: int, ttl_seconds: int) -> None:
        self.url = url
        self.maxlen = maxlen
        self.ttl_seconds = ttl_seconds
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()
        self._sender = _Sender(self)

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenStreams | None:
        """The token streams of these settings (None without a Redis for them)."""
        if not settings.tokens_url:
            return None
        return cls(
            settings.tokens_url,
            maxlen=settings.token_stream_maxlen,
            ttl_seconds=settings.token_stream_ttl_seconds,
        )

    @property
    def client(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30
                )
            return self._client

    def after_fork_in_child(self) -> None:
        # the parent's sender thread and connection are not this process's
        self._lock = threading.Lock()
        self._client = None
        self._sender = _Sender(self)

    def for_claim(self, turn_id: str, epoch: int) -> TurnTokens:
        """The sink of one claim of a turn (``TokenSink`` of the step layer)."""
        return TurnTokens(self, turn_id, epoch)

    def add(self, turn_id: str, fields: dict[Any, Any], *, touch: bool) -> None:
        """Queue one entry (``touch``: and renew the stream's expiry)."""
        self._sender.put((turn_id, fields, touch))

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Wait until every queued entry is written (or dropped); False after ``timeout``."""
        return self._sender.flush(timeout)

    def write(self, batch: list[tuple[str, dict[Any, Any], bool]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for turn_id, fields, touch in batch:
            key = stream_key(turn_id)
            pipe.xadd(key, fields, maxlen=self.maxlen, approximate=True)
            if touch:
                pipe.expire(key, self.ttl_seconds)
        pipe.execute()

    def read(
        self, turn_id: str, after: str, *, block_ms: int | None, count: int = 1000
    ) -> list[TokenEntry]:
        """The entries after stream id ``after`` ("0-0": all), waiting up to ``block_ms`` for
        the first (None: not at all)."""
        answer: Any = self.client.xread({stream_key(turn_id): after}, count=count, block=block_ms)
        entries: list[TokenEntry] = []
        for _key, rows in answer or []:
            for entry_id, fields in rows:
                entries.append(
                    TokenEntry(
                        id=_text(entry_id),
                        step=int(fields[b"s"]),
                        epoch=int(fields[b"e"]),
                        kind=_text(fields[b"k"]),
                        text=_text(fields.get(b"t", b"")),
                    )
                )
        return entries

    def forget(self, turn_id: str) -> None:
        self.client.delete(stream_key(turn_id))

    def close(self) -> None:
        self._sender.flush(FLUSH_SECONDS)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class TurnTokens:
    """The tokens of one claim of one turn."""

    def __init__(self, streams: TokenStreams, turn_id: str, epoch: int) -> None:
        self.streams = streams
        self.turn_id = turn_id
        self.epoch = epoch

    def begin(self, step: int) -> AttemptTokens:
        attempt = AttemptTokens(self, step)
        attempt.send("start", touch=True)
        return attempt


class AttemptTokens:
    """One attempt of one step's model call: its start, its pieces of text, its end."""

    def __init__(self, turn: TurnTokens, step: int) -> None:
        self.turn = turn
        self.step = step

    def send(self, kind: str, text: str = "", *, touch: bool = False) -> None:
        fields: dict[Any, Any] = {"s": self.step, "e": self.turn.epoch, "k": kind}
        if text:
            fields["t"] = text
        self.turn.streams.add(self.turn.turn_id, fields, touch=touch)

    def delta(self, text: str) -> None:
        self.send("delta", text)

    def finish(self) -> None:
        self.send("finish", touch=True)
        self.turn.streams.flush()

    def abandon(self) -> None:
        self.send("abandoned", touch=True)
        self.turn.streams.flush()


class _Sender:
    """The process's thread that writes queued entries, in order, a pipeline at a time."""

    def __init__(self, streams: TokenStreams) -> None:
        self.streams = streams
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, dict[Any, Any], bool]] = deque()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._down = False  # Redis was unreachable at the last write: said once

    def put(self, entry: tuple[str, dict[Any, Any], bool]) -> None:
        with self._cond:
            self._queue.append(entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="durable-agent-tokens", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                batch = list(self._queue)
                self._queue.clear()
                self._busy = True
            try:
                self.streams.write(batch)
                if self._down:
                    log.info("the token streams' Redis is back")
                self._down = False
            except redis.RedisError as error:
                if not self._down:
                    log.warning(
                        "the token streams' Redis is unavailable (%s): watchers get finished "
                        "steps only until it is back",
                        error,
                    )
                self._down = True
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
