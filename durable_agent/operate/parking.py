"""The park mechanism on Postgres: how a claim waits at a wait step (see ``step/wait_steps.py``).

At a wait step whose intent is written, :meth:`Parking.wait` first asks whether what it
waits for is there (an event of that name not yet consumed, the child turn ended, the due
time passed); if so that is the step's outcome. Otherwise it parks the turn in one fenced
statement (``park_turn``: status ``waiting``, no claim, no lease, no message, a ``waits``
row saying why and until when; refused when what it waits for arrived meanwhile), and
raises TurnParked: the worker acknowledges the message and its slot is free.

A woken turn is delivered again; the runner reads the finished steps back and reaches the
wait step again, now satisfied. Approvals park through the same row
(``park_for_approval``, kind ``approval``; see ``approvals.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..errors import LeaseLost, TurnCancelled, TurnParked
from ..journal import JournalStore, OperatorStore, WaitKind, WaitStore, digest, dumps

log = logging.getLogger(__name__)

AgentQueue = Callable[[str], str | None]
"""The queue of an agent by name (None: no such agent)."""


def child_turn_id(parent_turn_id: str, step: int) -> str:
    """The id of the child turn a wait step starts: derived from (turn, step)."""
    return "child_" + digest([parent_turn_id, step])[:32]


@dataclass
class Parking:
    """The park mechanism of one claim (``step.waits.Parking``)."""

    waits: WaitStore
    store: JournalStore
    operators: OperatorStore
    turn_id: str
    epoch: int
    agent_queue: AgentQueue
    max_depth: int
    before_park: Callable[[], None] = lambda: None
    to_send: tuple[str, str, str] | None = field(default=None, init=False)
    """A child turn created by this claim, to send once the parent is parked."""

    def prepare(self, step: int, spec: dict[str, Any]) -> dict[str, Any]:
        intent = dict(spec)
        kind = spec["wait"]
        seconds = spec.get("seconds") if kind == "sleep" else spec.get("timeout")
        if seconds is not None:
            intent["until"] = (self.store.now() + timedelta(seconds=seconds)).isoformat()
        if kind == "child":
            intent["child_turn_id"] = child_turn_id(self.turn_id, step)
            depth = self.waits.depth(self.turn_id) + 1
            if self.agent_queue(spec["agent"]) is None:
                intent["refused"] = f"there is no agent named {spec['agent']!r}"
            elif depth > self.max_depth:
                intent["refused"] = (
                    f"child agents nest at most {self.max_depth} deep "
                    "(DURABLE_AGENT_MAX_CHILD_DEPTH)"
                )
            intent["depth"] = depth
        return intent

    def wait(self, step: int, intent: dict[str, Any], parked: Callable[[], None]) -> dict[str, Any]:
        kind = intent["wait"]
        for _ in range(5):  # what it waits for may arrive while it parks: look again
            outcome = self._outcome(step, intent)
            if outcome is not None:
                return outcome
            until = _time(intent.get("until"))
            name = {"sleep": "", "event": intent.get("event"), "child": intent.get("child_turn_id")}
            self.before_park()
            if self.waits.park(self.turn_id, self.epoch, step, kind, str(name[kind]), until):
                log.info("turn %s parked at step %d (%s)", self.turn_id, step, _what(intent))
                parked()
                raise TurnParked(f"turn {self.turn_id} waits for {_what(intent)} (step {step})")
            self._why_not_parked()
        raise LeaseLost(f"turn {self.turn_id}: step {step} could neither park nor go on")

    def _outcome(self, step: int, intent: dict[str, Any]) -> dict[str, Any] | None:
        kind: WaitKind = intent["wait"]
        if kind == "event":
            event = self.waits.consume_event(self.turn_id, self.epoch, step, intent["event"])
            if event is not None:
                return {
                    "content": _text(event.payload),
                    "event": event.name,
                    "event_id": event.event_id,
                    "payload": event.payload,
                }
            if self._due(intent):
                return {
                    "content": f"No event {intent['event']!r} came within "
                    f"{intent['timeout']:g} seconds.",
                    "event": intent["event"],
                    "timed_out": True,
                }
            return None
        if kind == "sleep":
            if self._due(intent):
                return {"content": f"Waited {intent['seconds']:g} seconds.", "slept": True}
            return None
        return self._child(step, intent)

    def _child(self, step: int, intent: dict[str, Any]) -> dict[str, Any] | None:
        child_id, agent = intent["child_turn_id"], intent["agent"]
        if intent.get("refused"):
            return {
                "content": f"Error: agent {agent} was not asked: {intent['refused']}.",
                "error": True,
                "status": "refused",
                "child_turn_id": None,
            }
        child = self.store.find_turn(child_id)
        if child is None:
            queue = self.agent_queue(agent) or ""
            held, created = self.waits.create_child(
                self.turn_id,
                self.epoch,
                step,
                turn_id=child_id,
                message=intent["message"],
                agent=agent,
                queue=queue,
                depth=int(intent.get("depth") or 1),
            )
            if not held:
                self._why_not_parked()
                raise LeaseLost(f"turn {self.turn_id}: child turn not created, the claim moved on")
            if created:
                log.info(
                    "turn %s step %d started child turn %s (%s)",
                    self.turn_id,
                    step,
                    child_id,
                    agent,
                )
                self.to_send = (child_id, child_id, queue)
            return None
        if child.status == "done":
            return {"content": child.reply or "", "child_turn_id": child_id, "status": "done"}
        if child.status in ("failed", "cancelled"):
            return {
                "content": f"Error: agent {agent} ({child_id}) {child.status}: {child.error}",
                "error": True,
                "child_turn_id": child_id,
                "status": str(child.status),
            }
        if child.enqueued_at is None and self.to_send is None:
            self.to_send = (child.session_id, child_id, child.queue)  # created, never sent
        return None

    def _due(self, intent: dict[str, Any]) -> bool:
        until = _time(intent.get("until"))
        return until is not None and self.store.now() >= until

    def _why_not_parked(self) -> None:
        """Raise when the claim cannot go on; return when it can (what it waits for came)."""
        cancel = self.operators.find_cancellation(self.turn_id)
        if cancel is not None:
            raise TurnCancelled(f"turn {self.turn_id} cancelled by {cancel.requested_by}")
        turn = self.store.find_turn(self.turn_id)
        if turn is None or turn.lease_epoch != self.epoch or turn.status != "running":
            raise LeaseLost(f"turn {self.turn_id}: not parked, the epoch moved on")


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _text(payload: Any) -> str:
    return payload if isinstance(payload, str) else dumps(payload)


def _what(intent: dict[str, Any]) -> str:
    kind = intent["wait"]
    until = f" until {intent['until']}" if intent.get("until") else ""
    if kind == "event":
        return f"event {intent['event']!r}{until}"
    if kind == "child":
        return f"child turn {intent['child_turn_id']} ({intent['agent']})"
    return f"time{until}"
