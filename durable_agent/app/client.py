"""What an application calls: record a turn and enqueue it, read it, wait for it, send it
an event.

Each function works on the runtime of the settings it is given (the environment's when
none), so it reaches the same database, broker and queue as that runtime's workers and its
``run_turn`` task. Code that already holds a :class:`~durable_agent.runtime.Runtime` can call
the same methods on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

from celery.result import AsyncResult

from ..delivery.task_names import SEND_EVENT
from ..delivery.waker import deliver_event
from ..inputs import check_id
from ..journal import Event, Turn, WaitStore
from ..operate import events
from ..operate.events import EventSent
from ..operate.live import DEFAULT_POLL_SECONDS, TurnEvent
from ..runtime import runtime_for
from ..settings import Settings


def start_turn(
    session_id: str,
    message: str,
    *,
    turn_id: str | None = None,
    agent: str | None = None,
    settings: Settings | None = None,
    connection: object | None = None,
    concurrency_key: str | None = None,
) -> str:
    """Record a turn of ``agent`` (the environment's ``default`` agent when None) in
    Postgres, then enqueue it on the agent's queue; returns the turn id.

    The turn is durable once this returns, even if the broker is down: the sweeper
    enqueues turns that were recorded but never sent. Passing your own ``turn_id`` makes a
    retried call return the same turn instead of creating a second one.

    ``connection``: record the turn in your own transaction instead, on a SQLAlchemy
    ``Session`` or ``Connection`` (on the psycopg 3 driver) or a psycopg 3 connection. The
    turn exists only if that transaction commits, and its message is sent only after the
    commit (SQLAlchemy: from the commit event; psycopg: by the sweeper, after its grace
    period). A rollback leaves no turn and sends nothing.

    ``concurrency_key`` (e.g. the tenant): at most ``DURABLE_AGENT_CONCURRENCY_PER_KEY``
    turns of one key run at once across the fleet; the others wait, without a worker, and
    start in the order they were recorded.
    """
    return runtime_for(settings).start_turn(
        session_id,
        message,
        turn_id=turn_id,
        agent=agent,
        connection=connection,
        concurrency_key=concurrency_key,
    )


def get_turn(turn_id: str, *, settings: Settings | None = None) -> Turn:
    """The turn as recorded now; raises TurnNotFound for an unknown id."""
    return runtime_for(settings).get_turn(turn_id)


def wait_for_turn(
    turn_id: str,
    timeout: float = 60.0,
    *,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    settings: Settings | None = None,
) -> Turn:
    """Wait until the turn ends (done, failed or cancelled); raises TimeoutError after
    ``timeout`` seconds (a turn waiting for an approval has not ended: the error says so).

    It wakes when Postgres announces the turn's end (LISTEN/NOTIFY); ``poll_seconds`` is how
    often it reads anyway, so a lost announcement costs latency, never a hang."""
    return runtime_for(settings).wait_for_turn(turn_id, timeout, poll_seconds)


def stream_turn(
    turn_id: str,
    *,
    after_step: int = -1,
    timeout: float | None = None,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    tokens: bool = False,
    after: str | None = None,
    settings: Settings | None = None,
) -> Generator[TurnEvent, None, None]:
    """Each finished step of the turn after ``after_step`` (-1: from the start), in order, as
    it is recorded, then one ``end`` event (the turn done, failed or cancelled, with its
    reply or error). Resume from any step with ``after_step=<the last step you got>``: nothing is
    skipped and nothing comes twice, also when another worker resumes the turn after a
    crash. TimeoutError after ``timeout`` seconds without the end (None: no limit).

    ``tokens=True``: also the text of each streamed model answer as it arrives (``token``
    events, tagged with the step and the attempt), and ``abandoned`` when an attempt was given
    up (a worker died mid-answer: its text is void, the next attempt comes from its start).
    Each event's ``id`` is a cursor: pass the last one back as ``after`` to go on."""
    return runtime_for(settings).stream_turn(
        turn_id,
        after_step=after_step,
        timeout=timeout,
        poll_seconds=poll_seconds,
        tokens=tokens,
        after=after,
    )


class _SendEvent:
    """``send_event(turn_id, name, payload, event_id=...)``, and ``send_event.delay(...)``."""

    def __call__(
        self,
        turn_id: str,
        name: str,
        payload: Any = None,
        *,
        event_id: str | None = None,
        settings: Settings | None = None,
        connection: object | None = None,
    ) -> EventSent:
        """Send the event ``name`` with ``payload`` (JSON values) to a turn; it wakes the turn
        if it waits for ``name`` (``ctx.wait_for_event``), else it is kept until it does.
        Each event is read once; the same ``event_id`` sent again changes nothing (give one to
        make a retried send safe). Returns what happened (``woke``, ``kept``,
        ``duplicate``); raises TurnNotFound, or TurnEnded when the turn has ended.

        ``connection``: record the event in your own transaction instead, on a SQLAlchemy
        ``Session`` or ``Connection`` (on the psycopg 3 driver) or a psycopg 3 connection,
        as ``start_turn(connection=...)`` does. The event exists, and the turn wakes, only if
        that transaction commits; the woken turn is sent after the commit. The result is
        what holds in your transaction (``on_commit`` is True): ``woke`` means "wakes when
        it commits". A rollback leaves no event and the turn still waits."""
        runtime = runtime_for(settings)
        if connection is not None:
            from .wakes import send_event_in_transaction

            return send_event_in_transaction(runtime, connection, turn_id, name, payload, event_id)
        return deliver_event(runtime, turn_id, name, payload, event_id)

    def delay(
        self,
        turn_id: str,
        name: str,
        payload: Any = None,
        *,
        event_id: str | None = None,
        settings: Settings | None = None,
    ) -> AsyncResult:
        """The same on a worker, through the broker (the ``durable_agent.send_event`` task);
        the event id is fixed here, so a message delivered twice records one event."""
        runtime = runtime_for(settings)
        event_id = check_id("event_id", event_id) if event_id is not None else uuid.uuid4().hex
        task = runtime.celery.tasks[SEND_EVENT]
        result: AsyncResult = task.apply_async((turn_id, name, payload, event_id))
        return result


send_event = _SendEvent()


def list_events(turn_id: str, *, settings: Settings | None = None) -> list[Event]:
    """The events sent to a turn, oldest first, each with what became of it (``state``)."""
    runtime = runtime_for(settings)
    return events.list_events(WaitStore(runtime.database), runtime.get_turn, turn_id)
