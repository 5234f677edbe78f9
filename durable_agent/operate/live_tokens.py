"""A live turn with its tokens: the text of each streamed model call as it arrives, then the
finished step from the journal, then the end.

Two sources are merged in one order: the journal (Postgres: the finished steps, the end) and
the turn's token stream (Redis, ``tokens.py``). What a watcher is given, and why it never
shows a splice of two attempts or a text twice:

- A step the journal has finished is given whole (``step``), and tokens of that step or an
  earlier one that are read after it are dropped: a model call that was read back from the
  journal (already done) reaches watchers whole, never as tokens.
- Tokens carry their step and attempt (the claim's epoch). Once a watcher has given text of
  attempt *e* of step *n*, an entry of attempt *e' > e* of the same step (a worker resumed
  the turn after the first one died, or after a deferral) first gives ``abandoned`` for *e*,
  then the new attempt from its start (its ``start`` entry precedes all its text); entries
  of an older attempt that arrive after a newer one (a worker that lost its claim but still
  runs) are dropped.
- The cursor of each event (``TurnEvent.id``) holds the last step given, the last stream id
  read and the attempt being given: passed back as ``after``, the stream goes on with nothing
  twice and nothing skipped (``Cursor``).

Tokens come through ``XREAD BLOCK`` in slices of ``_BLOCK_MS``; the journal is read when
Postgres announces a step (``live.py``), and every ``poll_seconds`` whatever it heard, so a
watcher waiting through a long tool call costs Redis reads, not Postgres queries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from dataclasses import dataclass

import redis

from ..errors import InvalidArgument
from ..inputs import check_id, check_timeout
from ..journal import JournalStore, Turn
from .live import Announcements, Subscription, TurnEvent, WithSpend, _wait, check_after_step
from .tokens import TokenEntry, TokenStreams

log = logging.getLogger(__name__)

_BLOCK_MS = 100  # the longest a token read waits before the journal is read again


@dataclass(frozen=True)
class Cursor:
    """Where a token stream goes on from: ``<last step>/<stream id>/<step>.<attempt>``."""

    last_step: int = -1
    stream_id: str = "0-0"
    attempt: tuple[int, int] | None = None  # (step, epoch) of the text being given

    def __str__(self) -> str:
        attempt = f"{self.attempt[0]}.{self.attempt[1]}" if self.attempt else "-"
        return f"{self.last_step}/{self.stream_id}/{attempt}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """A cursor from an event's id; a bare step number means after that step."""
        value = text.strip()
        try:
            if "/" not in value:
                return cls(last_step=int(value))
            last, stream_id, attempt = value.split("/")
            ms, _, seq = stream_id.partition("-")
            int(ms), int(seq)
            pair = None
            if attempt != "-":
                step, _, epoch = attempt.partition(".")
                pair = (int(step), int(epoch))
            cursor = cls(int(last), stream_id, pair)
        except ValueError:
            raise InvalidArgument(
                f"after must be an event id of a token stream or a step number, not {text!r}"
            ) from None
        if cursor.last_step < -1:
            raise InvalidArgument(f"after must not be below -1, not {text!r}")
        return cursor


def stream_with_tokens(
    store: JournalStore,
    announcements: Announcements,
    with_spend: WithSpend,
    tokens: TokenStreams,
    turn_id: str,
    cursor: Cursor,
    deadline: float | None,
    timeout: float | None,
    poll_seconds: float,
) -> Generator[TurnEvent, None, None]:
    """The events of ``turn_id`` after ``cursor`` (see the module's docstring)."""
    next_step = cursor.last_step + 1
    stream_id = cursor.stream_id
    attempt = cursor.attempt
    tokens_up = True
    read_at: float | None = None  # when the journal was last read (None: read it now)
    backlog: list[TokenEntry] = []  # entries read before the steps they come after
    turn = store.get_turn(turn_id)
    with announcements.subscribe(turn_id) as subscription:
        while True:
            if read_at is None or time.monotonic() - read_at >= poll_seconds:
                turn = store.get_turn(turn_id)
                read_at = time.monotonic()
                for step in store.load_journal_from(turn_id, next_step):
                    if step.step != next_step or step.status != "done":
                        break
                    next_step += 1
                    if attempt is not None and attempt[0] < next_step:
                        attempt = None  # that step is done: its text is in the step
                    at = str(Cursor(next_step - 1, stream_id, attempt))
                    yield TurnEvent(turn_id, "step", step=step, cursor=at)
                for entry in backlog:
                    stream_id = entry.id
                    events, attempt = _apply(turn_id, entry, next_step, attempt)
                    yield from events
                backlog = []
                if turn.finished:
                    yield TurnEvent(turn_id, "end", turn=with_spend([turn])[0])
                    return
            if not tokens_up:
                tokens_up = _wait_for_tokens(subscription, turn, poll_seconds, deadline, timeout)
                read_at = None
                continue
            _check_deadline(subscription, turn, deadline, timeout)
            try:
                announced = _pending(subscription)  # then the journal is read next
                entries = tokens.read(turn_id, stream_id, block_ms=None if announced else _BLOCK_MS)
            except redis.RedisError as error:
                log.warning(
                    "the token stream of %s cannot be read (%s): steps only", turn_id, error
                )
                tokens_up, read_at = False, None
                continue
            if announced:
                read_at = None
            if any(entry.step > next_step for entry in entries):
                # a later step's call has begun, so every step before it is in the journal:
                # give those first, then this text
                backlog, read_at = entries, None
                continue
            for entry in entries:
                stream_id = entry.id
                events, attempt = _apply(turn_id, entry, next_step, attempt)
                yield from events


def _apply(
    turn_id: str, entry: TokenEntry, next_step: int, attempt: tuple[int, int] | None
) -> tuple[list[TurnEvent], tuple[int, int] | None]:
    """What one entry of the token stream gives a watcher, and the attempt it shows after."""
    if entry.step < next_step or entry.kind == "finish":
        return [], attempt  # a finished step is given whole, from the journal
    events: list[TurnEvent] = []
    if attempt is not None and attempt[0] == entry.step:
        if entry.epoch < attempt[1]:
            return [], attempt  # an older attempt, still writing: not shown
        if entry.epoch > attempt[1]:
            at = str(Cursor(next_step - 1, entry.id, None))
            events.append(
                TurnEvent(
                    turn_id, "abandoned", step_number=attempt[0], attempt=attempt[1], cursor=at
                )
            )
            attempt = None
    if entry.kind == "abandoned":
        if attempt == (entry.step, entry.epoch):
            at = str(Cursor(next_step - 1, entry.id, None))
            events.append(
                TurnEvent(
                    turn_id, "abandoned", step_number=entry.step, attempt=entry.epoch, cursor=at
                )
            )
            attempt = None
        return events, attempt
    attempt = (entry.step, entry.epoch)
    if entry.kind == "delta":
        at = str(Cursor(next_step - 1, entry.id, attempt))
        events.append(
            TurnEvent(
                turn_id,
                "token",
                step_number=entry.step,
                attempt=entry.epoch,
                text=entry.text,
                cursor=at,
            )
        )
    return events, attempt


def _pending(subscription: Subscription) -> bool:
    """Whether Postgres announced something this watcher has not read (without waiting)."""
    return subscription.wait(0)


def _check_deadline(
    subscription: Subscription, turn: Turn, deadline: float | None, timeout: float | None
) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        _wait(subscription, turn, 0.0, deadline, timeout)


def _wait_for_tokens(
    subscription: Subscription,
    turn: Turn,
    poll_seconds: float,
    deadline: float | None,
    timeout: float | None,
) -> bool:
    """Without Redis: wait as a steps-only watcher does; try the tokens again after."""
    _wait(subscription, turn, poll_seconds, deadline, timeout)
    return True


def open_token_stream(
    store: JournalStore,
    announcements: Announcements,
    with_spend: WithSpend,
    tokens: TokenStreams | None,
    turn_id: str,
    *,
    after: str | None,
    after_step: int,
    timeout: float | None,
    poll_seconds: float,
) -> Generator[TurnEvent, None, None]:
    """``stream_turn(..., tokens=True)``: the arguments checked here, before the first event."""
    if tokens is None:
        raise InvalidArgument(
            "tokens=True needs a Redis for the token streams (DURABLE_AGENT_TOKEN_STREAM_URL, "
            "or a redis:// broker)"
        )
    check_id("turn_id", turn_id)
    cursor = Cursor.parse(after) if after is not None else Cursor(check_after_step(after_step))
    deadline = None if timeout is None else time.monotonic() + check_timeout(timeout)
    if check_timeout(poll_seconds) <= 0:
        raise InvalidArgument("poll_seconds must be more than 0")
    store.get_turn(turn_id)
    return stream_with_tokens(
        store, announcements, with_spend, tokens, turn_id, cursor, deadline, timeout, poll_seconds
    )
