"""The Celery tasks of a runtime: what an application sends, what a worker runs.

``run_turn(session_id, turn_id)`` runs a turn the application recorded (``start_turn`` does
both). ``agent_turn(session_id, message, turn_id=None, agent=None)`` takes the message
itself, for an application that only uses ``.delay()``: it is sent to the agent's queue,
records the turn on its first delivery, then runs it. ``sweep()`` is one sweeper pass, for
``celery beat``. ``send_event(turn_id, name, payload, event_id)`` records an event for a
turn on a worker (``durable_agent.send_event.delay(...)``; see ``operate/events.py``).

Calling ``run_turn.delay()`` or ``agent_turn.delay()`` checks the arguments in the caller's
process, so a mistake (a message where a turn id belongs, an over-long id) is an exception
there, not a silent drop on a worker. On a worker, every message is checked again before it
runs (``durable_agent.delivery.poison``), and the task's state in Flower says what happened: SUCCESS
with the outcome ("done", "refused: ...", "deferred: ..."), or FAILURE with the reason the
turn failed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery, Task
from celery.result import AsyncResult
from kombu.exceptions import OperationalError as KombuOperationalError

from ..errors import (
    ConfigurationError,
    DurableAgentError,
    InvalidArgument,
    ServiceUnavailable,
    TurnEnded,
    TurnFailed,
    TurnNotFound,
)
from ..inputs import check_id, check_message
from ..journal import Database, JournalStore, worker_identity
from ..settings import Settings
from ..step.agents import AgentBook, check_agent_name
from .doorbell import new_message_id, trace_headers
from .outage import Outage
from .task_names import AGENT_TURN, RUN_TURN, SEND_EVENT, SWEEP
from .waker import deliver_event

if TYPE_CHECKING:
    from ..telemetry.tracing import Tracing
    from .sweeper import Sweeper
    from .turn_worker import TurnWorker

__all__ = [
    "AGENT_TURN",
    "RUN_TURN",
    "SEND_EVENT",
    "SWEEP",
    "TaskParts",
    "handle_delivery",
    "register_tasks",
]

log = logging.getLogger("durable_agent.tasks")


class TaskParts(Protocol):
    """What the tasks use of the runtime that registered them: its parts are built on
    first use, in the process that runs the task (a prefork child builds its own)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def journal(self) -> JournalStore: ...

    @property
    def outage(self) -> Outage: ...

    @property
    def celery(self) -> Celery: ...

    def agent_queue(self, agent: str | None) -> tuple[str, str]: ...

    def turn_worker(self) -> TurnWorker: ...

    def sweeper(self) -> Sweeper: ...

    def enqueue(self, session_id: str, turn_id: str, queue: str = "", trace: str = "") -> None: ...

    @property
    def tracing(self) -> Tracing | None: ...

    def trace_context(self) -> str | None: ...

    @property
    def database(self) -> Database: ...

    @property
    def agents(self) -> AgentBook: ...

    def publish(
        self, session_id: str, turn_id: str, *, queue: str = "", message_id: str
    ) -> None: ...


_GUARD = "durable_agent.delivery.poison:guarded_strategy"


class TurnTask(Task):  # type: ignore[misc]
    """The base of our tasks: a failed turn is an expected failure, logged without a
    traceback and shown as FAILURE with its reason."""

    abstract = True
    throws = (TurnFailed, TurnNotFound, InvalidArgument, TurnEnded)
    runtime: TaskParts


class RunTurnTask(TurnTask):
    """``run_turn``: checks in the caller that the turn exists, and notes the message."""

    abstract = True

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> AsyncResult:
        session_id, turn_id = _run_turn_arguments(args, kwargs)
        runtime = self.runtime
        try:
            turn = runtime.journal.find_turn(turn_id)
        except ServiceUnavailable as error:  # the sweeper knows the turn: send it anyway
            log.warning("run_turn.delay(%r): cannot check the turn (%s)", turn_id, error)
            return super().apply_async((session_id, turn_id), None, **options)
        if turn is None:  # most often a message where the turn id belongs
            raise InvalidArgument(f"no turn with id {turn_id!r} is recorded; {AGENT_TURN_HINT}")
        message_id = options.pop("task_id", None) or new_message_id()
        runtime.journal.mark_sent([turn_id], [message_id])
        options.setdefault("queue", turn.queue or runtime.settings.queue)
        _join_trace(options, runtime.trace_context())
        return super().apply_async((session_id, turn_id), None, task_id=message_id, **options)


class AgentTurnTask(TurnTask):
    """``agent_turn``: checks the message in the caller, records the turn, then sends it.

    The turn id is the task id (``AsyncResult.id``), and the turn is in Postgres before the
    message is on the broker: ``get_turn(r.id)`` and ``wait_for_turn(r.id)`` work at once,
    an unknown id is never "not recorded yet", and a message the broker could not take is
    sent later by the sweeper, as for ``start_turn``."""

    abstract = True

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> AsyncResult:
        args, kwargs = list(args or ()), dict(kwargs or {})
        try:
            _check_agent_turn(args, kwargs)
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        session_id, message = args
        runtime = self.runtime
        check_message(message, runtime.settings.max_message_bytes)
        turn_id = kwargs.get("turn_id")
        task_id = options.pop("task_id", None)
        if turn_id is not None and task_id is not None and task_id != turn_id:
            raise InvalidArgument(
                f"agent_turn: the task id is the turn id; got turn_id={turn_id!r} and "
                f"task_id={task_id!r}"
            )
        turn_id = check_id("turn_id", turn_id or task_id or new_message_id())
        name, queue = runtime.agent_queue(kwargs.get("agent"))
        trace = runtime.trace_context()  # the caller's span, when tracing is on
        turn = runtime.journal.create_turn(
            session_id,
            message,
            turn_id=turn_id,
            queue=queue,
            agent=name,
            trace_context=trace,
            concurrency_key=kwargs.get("concurrency_key"),
        )
        result = TurnResult(turn_id, app=self.app)
        if turn.finished:  # the same turn submitted again: nothing to send
            return result
        options.setdefault("queue", turn.queue or queue)
        _join_trace(options, trace)
        runtime.journal.mark_sent([turn_id], [turn_id])
        try:
            super().apply_async(
                (session_id, message), {**kwargs, "turn_id": turn_id}, task_id=turn_id, **options
            )
        except (KombuOperationalError, OSError) as error:
            runtime.journal.unmark_sent(turn_id, turn_id)
            log.warning(
                "turn %s is recorded; cannot reach the broker (%s); the sweeper will enqueue it",
                turn_id,
                error,
            )
        return result


class TurnResult(AsyncResult):  # type: ignore[misc]
    """The ``AsyncResult`` of ``agent_turn.delay()``: its id is the turn id. ``get()``
    reads the end of the turn that whichever worker ended it stored under that id (no task
    stores its own return value); without ``DURABLE_AGENT_RESULT_BACKEND`` it says to use
    ``wait_for_turn`` instead of returning None."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if not self.app.conf.result_backend:
            raise ConfigurationError(
                "no result backend is configured (DURABLE_AGENT_RESULT_BACKEND): use "
                f"wait_for_turn({self.id!r}) or get_turn(), which read Postgres"
            )
        return super().get(*args, **kwargs)


AGENT_TURN_HINT = (
    "run_turn takes (session_id, turn_id) of a turn already recorded; to start a turn from "
    "a message use agent_turn.delay(session_id, message) or start_turn(session_id, message)"
)


def register_tasks(app: Celery, runtime: TaskParts) -> None:
    """Register the tasks on the runtime's app (``shared=False``: Celery would otherwise add
    these closures, bound to this runtime, to every app made later in the process)."""

    def run_turn(self: Task, session_id: str, turn_id: str) -> str:
        """Claim the turn in Postgres and run it; step aside if someone else holds it."""
        return handle_delivery(runtime, turn_id, self.request)

    def agent_turn(
        self: Task,
        session_id: str,
        message: str,
        turn_id: str | None = None,
        agent: str | None = None,
        concurrency_key: str | None = None,
    ) -> str:
        """Run the turn ``agent_turn.delay()`` recorded; record it first if the message was
        published without it (``send_task`` by name), under the task id. Every check the
        caller makes holds here too: a message no caller could have sent is refused."""
        turn_id = turn_id or str(self.request.id)
        try:
            check_message(message, runtime.settings.max_message_bytes)
            if runtime.journal.find_turn(turn_id) is None:
                name, queue = runtime.agent_queue(agent)
                if concurrency_key is not None:
                    check_id("concurrency_key", concurrency_key)
                runtime.journal.create_turn(
                    session_id,
                    message,
                    turn_id=turn_id,
                    queue=queue,
                    agent=name,
                    concurrency_key=concurrency_key,
                )
        except InvalidArgument as error:
            log.warning("agent_turn %s refused: %s", turn_id, error)
            refusal = InvalidArgument(f"agent_turn {turn_id} refused: {error}")
            from .results import store_refusal

            store_refusal(runtime, turn_id, refusal)
            raise refusal from None
        return handle_delivery(runtime, turn_id, self.request)

    def send_event(
        self: Task, turn_id: str, name: str, payload: Any = None, event_id: str | None = None
    ) -> str:
        """Record an event for a turn (waking it if it waits for it); the outcome."""
        return deliver_event(runtime, turn_id, name, payload, event_id).outcome

    def sweep(self: Task) -> int:
        """One sweep pass, for those who schedule it with ``celery beat`` instead."""
        return len(runtime.sweeper().sweep_once())

    def received(args: list[Any], kwargs: dict[str, Any], message_id: str) -> None:
        """In the worker's main process, as a run_turn message arrives: note who has it, so
        that the sweeper sends the turn again if this worker dies before it claims it."""
        note_receipt(args[1], message_id)

    def agent_turn_received(args: list[Any], kwargs: dict[str, Any], message_id: str) -> None:
        """The same for an agent_turn message (its turn id is the message's unless given)."""
        note_receipt(kwargs.get("turn_id") or message_id, message_id)

    def note_receipt(turn_id: str, message_id: str) -> None:
        try:
            runtime.journal.record_receipt(turn_id, message_id, worker_identity())
        except ServiceUnavailable as error:
            runtime.outage.report(error)  # the claim will wait for Postgres anyway
        except DurableAgentError as error:
            log.warning("could not note the receipt of %s: %s", turn_id, error)

    common = {"bind": True, "shared": False, "ignore_result": True, "Strategy": _GUARD}
    app.task(
        name=RUN_TURN,
        base=RunTurnTask,
        acks_late=True,
        check_arguments=staticmethod(_check_run_turn),
        on_receipt=staticmethod(received),
        runtime=runtime,
        **common,
    )(run_turn)
    app.task(
        name=AGENT_TURN,
        base=AgentTurnTask,
        acks_late=True,
        check_arguments=staticmethod(_check_agent_turn),
        on_receipt=staticmethod(agent_turn_received),
        runtime=runtime,
        **common,
    )(agent_turn)
    app.task(
        name=SEND_EVENT,
        base=TurnTask,
        acks_late=True,
        check_arguments=staticmethod(_check_send_event),
        runtime=runtime,
        **common,
    )(send_event)
    app.task(
        name=SWEEP,
        base=TurnTask,
        check_arguments=staticmethod(_check_sweep),
        runtime=runtime,
        **common,
    )(sweep)


def handle_delivery(runtime: TaskParts, turn_id: str, request: Any = None) -> str:
    """One delivery of a turn: what became of it, as the task's result (SUCCESS), or
    TurnFailed with the reason (FAILURE).

    No delivery schedules a later one with a countdown: a turn that must be looked at again
    (a live claim of another worker, a deferral after a model outage) is re-sent by the
    sweeper from Postgres when it is due. Celery's countdown messages wait unacked in a
    worker's memory, and with kombu 5.7 on Redis such a worker dies when the broker
    connection drops.

    With tracing on, the delivery is a span, child of the trace context in the message
    (``request``: the task's) or else of the one stored with the turn.
    """
    tracing = runtime.tracing
    if tracing is None:
        return _handle_delivery(runtime, turn_id)
    with tracing.delivery(
        turn_id, _message_headers(request), lambda: runtime.journal.trace_context(turn_id)
    ) as span:
        span.set_attribute("durable_agent.message_id", str(getattr(request, "id", "") or ""))
        try:
            result = _handle_delivery(runtime, turn_id)
        except TurnFailed:  # the span records the error too
            span.set_attribute("durable_agent.outcome", "failed")
            raise
        span.set_attribute("durable_agent.outcome", result.split(":", 1)[0])
        return result


def _join_trace(options: dict[str, Any], trace: str | None) -> None:
    """Put the trace context in the message's headers (a no-op without one)."""
    headers = trace_headers(trace)
    if headers:
        options["headers"] = {**(options.get("headers") or {}), **headers}


def _message_headers(request: Any) -> dict[str, Any]:
    """The trace headers of the task's message: Celery puts a message's own headers on the
    request (and, in some versions, under ``request.headers`` too)."""
    if request is None:
        return {}
    found: dict[str, Any] = {}
    nested = getattr(request, "headers", None)
    if isinstance(nested, dict):
        found.update(nested)
    for key in ("traceparent", "tracestate"):
        value = getattr(request, key, None)
        if value:
            found[key] = value
    return found


def _handle_delivery(runtime: TaskParts, turn_id: str) -> str:
    from .turn_worker import Delivery, Outcome

    worker = runtime.turn_worker()
    while True:
        try:
            delivery = worker.handle(turn_id)
        except ServiceUnavailable as error:
            delivery = Delivery(turn_id, Outcome.INTERRUPTED, str(error))
        if delivery.outcome != Outcome.INTERRUPTED:
            runtime.outage.recovered()
            break
        # Postgres is unreachable: keep the message, wait for Postgres, then handle the turn
        # again here; the claim is this worker's own, so nothing counts as a crash.
        runtime.outage.wait()
    for follow_up in (delivery.follow_up, delivery.next_of_key):
        if follow_up is None:
            continue
        try:
            runtime.enqueue(*follow_up)
        except DurableAgentError as error:
            log.warning("could not enqueue %s (the sweeper will): %s", follow_up, error)
    log.info("turn %s: %s %s", turn_id, delivery.outcome, delivery.detail[:200])
    if delivery.outcome in (Outcome.DONE, Outcome.FAILED, Outcome.CANCELLED, Outcome.REFUSED):
        from .results import store_end

        store_end(runtime, turn_id)  # under the turn id, whichever message this was
    if delivery.outcome == Outcome.FAILED:
        raise TurnFailed(f"turn {turn_id} failed: {delivery.detail}")
    if delivery.outcome == Outcome.DONE:
        return "done"
    return f"{delivery.outcome}: {delivery.detail[:300]}"


# -- the arguments each task takes (checked in the caller and again on the worker) ---------


def _run_turn_arguments(args: Any, kwargs: Any) -> tuple[str, str]:
    args, kwargs = list(args or ()), dict(kwargs or {})
    try:
        _check_run_turn(args, kwargs)
    except ValueError as error:
        raise InvalidArgument(f"{error}; {AGENT_TURN_HINT}") from None
    return args[0], args[1]


def _check_run_turn(args: list[Any], kwargs: dict[str, Any]) -> None:
    if kwargs or len(args) != 2:
        raise ValueError(
            f"run_turn takes (session_id, turn_id), got {len(args)} argument(s) and "
            f"keywords {sorted(kwargs)[:5]}"
        )
    for name, value in zip(("session_id", "turn_id"), args, strict=True):
        try:
            check_id(name, value)
        except InvalidArgument as error:
            raise ValueError(str(error)) from None


def _check_agent_turn(args: list[Any], kwargs: dict[str, Any]) -> None:
    unknown = sorted(set(kwargs) - {"turn_id", "agent", "concurrency_key"})
    if unknown or len(args) != 2:
        raise ValueError(
            "agent_turn takes (session_id, message, turn_id=None, agent=None, "
            "concurrency_key=None), got "
            f"{len(args)} argument(s) and keywords {sorted(kwargs)[:5]}"
        )
    try:
        check_id("session_id", args[0])
        if not isinstance(args[1], str) or not args[1].strip() or "\x00" in args[1]:
            raise InvalidArgument("message must be non-empty text with no NUL")
        if kwargs.get("turn_id") is not None:
            check_id("turn_id", kwargs["turn_id"])
        if kwargs.get("concurrency_key") is not None:
            check_id("concurrency_key", kwargs["concurrency_key"])
        if kwargs.get("agent") is not None:
            check_agent_name(kwargs["agent"])
    except InvalidArgument as error:
        raise ValueError(str(error)) from None


def _check_send_event(args: list[Any], kwargs: dict[str, Any]) -> None:
    names = ("turn_id", "name", "payload", "event_id")
    given = dict(zip(names, args, strict=False)) | kwargs
    if len(args) > 4 or set(kwargs) - set(names) or not {"turn_id", "name"} <= set(given):
        raise ValueError("send_event takes (turn_id, name, payload=None, event_id=None)")
    try:
        check_id("turn_id", given["turn_id"])
        if given.get("event_id") is not None:
            check_id("event_id", given["event_id"])
        from ..step.wait_steps import check_event_name

        check_event_name(given["name"])
    except InvalidArgument as error:
        raise ValueError(str(error)) from None


def _check_sweep(args: list[Any], kwargs: dict[str, Any]) -> None:
    if args or kwargs:
        raise ValueError("sweep takes no arguments")
