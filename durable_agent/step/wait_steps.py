"""Waits: a step that parks the turn until a time, an event or a child agent's reply.

A loop waits through its context (``ctx.sleep(seconds)``, ``ctx.wait_for_event(name,
timeout=...)``, ``ctx.run_agent(agent, message)``); an agent on the built-in loop is given
a *waiting tool* (:data:`wait_seconds`, :data:`wait_for_event`, :func:`event_tool`,
:func:`agent_tool`, or another :class:`~durable_agent.Agent` in its ``tools``), and the
model's call of it is the wait. Each wait is one step of the journal, kind ``wait``:

* its intent is written first and fixes what it waits for: the due time (from Postgres'
  clock, when the step is first written: a redelivered turn does not restart the clock),
  the event name, the child turn's id (derived from the turn and the step, so a crash
  between creating the child and parking creates no second child);
* then the worker parks the turn (:class:`Parking`; the Postgres one is
  ``durable_agent.operate.parking``): no claim, no lease, no message, no worker slot;
* whatever satisfies it wakes the turn, any worker resumes it, reads the finished steps
  back and records the wait's outcome (the event consumed exactly once, the child's
  reply, the time that passed) as the step's output.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidArgument, TurnFailed
from .tools import Tool, _build

MAX_WAIT_SECONDS = 366 * 86_400.0
"""The longest a single wait may last (a year)."""

SLEEP = "sleep"


class Parking(Protocol):
    """What the runner needs to wait (one claim of one turn)."""

    def prepare(self, step: int, spec: dict[str, Any]) -> dict[str, Any]:
        """The intent of a new wait step: ``spec`` with what the first writing fixes (the
        due time, the child's turn id)."""
        ...

    def wait(self, step: int, intent: dict[str, Any], parked: Callable[[], None]) -> dict[str, Any]:
        """The wait's outcome when what it waits for is there; otherwise park the turn, call
        ``parked`` and raise TurnParked."""
        ...


class ChildTurnFailed(TurnFailed):
    """A child agent's turn failed or was cancelled (``ctx.run_agent``): catch it to act on
    it; uncaught, the parent fails with this reason."""

    def __init__(self, message: str, *, turn_id: str, status: str) -> None:
        super().__init__(message)
        self.turn_id, self.status = turn_id, status


@dataclass(frozen=True)
class EventResult:
    """What ``ctx.wait_for_event`` got: the event (``payload``, ``event_id``), or
    ``timed_out`` when the timeout came first (then both are None)."""

    name: str
    payload: Any = None
    event_id: str | None = None
    timed_out: bool = False

    @property
    def received(self) -> bool:
        return not self.timed_out


def check_seconds(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    if not 0 <= value <= MAX_WAIT_SECONDS:
        raise InvalidArgument(f"{name} must be from 0 to {MAX_WAIT_SECONDS:.0f} seconds")
    return float(value)


def check_event_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200 or not name.isprintable():
        raise InvalidArgument(f"an event name is 1-200 printable characters, got {name!r}")
    return name


def sleep_spec(seconds: Any) -> dict[str, Any]:
    return {"wait": "sleep", "seconds": check_seconds("seconds", seconds)}


def event_spec(name: Any, timeout: Any) -> dict[str, Any]:
    return {
        "wait": "event",
        "event": check_event_name(name),
        "timeout": check_seconds("timeout", timeout, allow_none=True),
    }


def child_spec(agent: str, message: Any) -> dict[str, Any]:
    if not isinstance(message, str) or not message.strip() or "\x00" in message:
        raise InvalidArgument("the message for a child agent must be non-empty text with no NUL")
    return {"wait": "child", "agent": agent, "message": message}


def event_result(name: str, output: dict[str, Any]) -> EventResult:
    if output.get("timed_out"):
        return EventResult(name, timed_out=True)
    return EventResult(name, output.get("payload"), output.get("event_id"))


def child_reply(output: dict[str, Any]) -> str:
    if output.get("error"):
        raise ChildTurnFailed(
            str(output.get("content")),
            turn_id=str(output.get("child_turn_id")),
            status=str(output.get("status")),
        )
    return str(output.get("content") or "")


# -- waiting tools for agents on the built-in loop ------------------------------------------


def _waiting(
    fn: Callable[..., Any], name: str, wait: Callable[[dict[str, Any]], dict[str, Any]]
) -> Tool:
    """A tool whose call is a wait step (not registered: give it to an agent's tools)."""
    return dataclasses.replace(_build(fn, "safe", name), wait=wait)


def _wait_seconds(seconds: int) -> str:
    """Wait this many seconds before going on (the turn sleeps; nothing runs meanwhile).
    Use it to check again later.

    Args:
        seconds: How long to wait, in seconds (at least 1).
    """
    raise AssertionError("a waiting tool is run by the step runner")  # pragma: no cover


def _wait_for_event(name: str, timeout_seconds: int = 3600) -> str:
    """Wait for a named event sent to this conversation (for example a payment that
    settles); returns the event's payload, or says that the timeout came first.

    Args:
        name: The event's name.
        timeout_seconds: How long to wait at most, in seconds.
    """
    raise AssertionError("a waiting tool is run by the step runner")  # pragma: no cover


wait_seconds = _waiting(_wait_seconds, "wait_seconds", lambda a: sleep_spec(max(1, a["seconds"])))
"""A tool that lets the model decide to wait (``"check again in 10 minutes"``)."""

wait_for_event = _waiting(
    _wait_for_event,
    "wait_for_event",
    lambda a: event_spec(a["name"], a["timeout_seconds"]),
)
"""A tool that waits for an event of the name the model gives."""


def event_tool(
    event: str, *, name: str | None = None, timeout: float = 3600.0, description: str = ""
) -> Tool:
    """A tool that waits for one named event (``name`` defaults to ``wait_for_<event>``)."""
    check_event_name(event)
    check_seconds("timeout", timeout)

    def waits(timeout_seconds: int = int(timeout)) -> str:
        raise AssertionError("a waiting tool is run by the step runner")  # pragma: no cover

    waits.__doc__ = (
        description
        or f"Wait for the event {event!r}; returns its payload, or says that the "
        "timeout came first."
    ) + "\n\nArgs:\n    timeout_seconds: How long to wait at most, in seconds.\n"
    tool_name = name or "wait_for_" + "".join(c if c.isalnum() else "_" for c in event)[:50]
    return _waiting(waits, tool_name, lambda a: event_spec(event, a["timeout_seconds"]))


def agent_tool(agent: Any, *, name: str | None = None, description: str = "") -> Tool:
    """A tool that asks another agent (an :class:`~durable_agent.Agent` or its name): the
    model's call starts a child turn of that agent with the message, and reads its reply."""
    agent_name = agent if isinstance(agent, str) else agent.name

    def ask(message: str) -> str:
        raise AssertionError("a waiting tool is run by the step runner")  # pragma: no cover

    ask.__doc__ = (
        description or f"Ask the {agent_name} agent; returns its reply."
    ) + "\n\nArgs:\n    message: What to ask it, with everything it needs to know.\n"
    tool_name = name or "".join(c if c.isalnum() or c in "_-" else "_" for c in agent_name)
    return _waiting(ask, tool_name, lambda a: child_spec(agent_name, a["message"]))
