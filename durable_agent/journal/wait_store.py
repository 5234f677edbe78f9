"""Parked turns: sleeps, events and child agents (and approvals, through the same ``waits``
row). One method per named query (``sql/queries.sql``, section "parked turns").

A parked turn is ``waiting`` with no claim, no lease and no message; its ``waits`` row says
why (``approval``, ``sleep``, ``event``, ``child``) and until when. Whatever satisfies the
wait wakes it in the same transaction as its own write (``durable_agent_wake``: an event's
sender, the end of a child by a trigger) or, at the due time, the sweeper (``wake_due``);
a woken turn is ``queued`` with no message, announced on ``durable_agent_wake`` so that a
worker's waker sends it at once (``claim_send``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .db import Database
from .records import _Row
from .sealing import Where

WaitKind = Literal["approval", "sleep", "event", "child"]


@dataclass(frozen=True, slots=True)
class Wait(_Row):
    """What a parked turn waits for (``name``: the tool, the event name, the child turn id;
    empty for a sleep) and until when (``wake_at``; None: until it comes)."""

    turn_id: str
    step: int
    kind: str
    name: str
    wake_at: datetime | None
    parked_at: datetime

    def describe(self) -> str:
        what = {
            "approval": f"approval of {self.name}",
            "sleep": "time",
            "event": f"event {self.name!r}",
            "child": f"child turn {self.name}",
        }.get(self.kind, f"{self.kind} {self.name}")
        until = f" until {self.wake_at.isoformat(timespec='seconds')}" if self.wake_at else ""
        return f"{what} (step {self.step}){until}"

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "kind": self.kind,
            "name": self.name,
            "wake_at": self.wake_at.isoformat() if self.wake_at else None,
            "parked_at": self.parked_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class Event(_Row):
    """An event sent to a turn; ``consumed_step``: the wait that read it (None: not yet)."""

    turn_id: str
    event_id: str
    name: str
    payload: Any
    sent_at: datetime
    consumed_step: int | None = None
    consumed_at: datetime | None = None
    turn_status: str | None = None

    @property
    def state(self) -> str:
        if self.consumed_step is not None:
            return f"consumed at step {self.consumed_step}"
        if self.turn_status in ("done", "failed", "cancelled"):
            return f"never read: the turn ended ({self.turn_status})"
        return "kept until the turn waits for it"

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "event_id": self.event_id,
            "name": self.name,
            "payload": self.payload,
            "sent_at": self.sent_at.isoformat(),
            "consumed_step": self.consumed_step,
            "consumed_at": self.consumed_at.isoformat() if self.consumed_at else None,
            "state": self.state,
        }


@dataclass(frozen=True, slots=True)
class Recorded:
    """What became of a sent event: the turn's status (None: no such turn), whether the
    event is new, the name recorded under its id, and whether it woke the turn."""

    status: str | None
    new: bool
    recorded_name: str | None
    woke: bool

    @classmethod
    def from_row(cls, row: dict[str, Any] | None) -> Recorded:
        """From the row of ``record_event`` (None: no such turn)."""
        if row is None:
            return cls(None, False, None, False)
        return cls(row["status"], bool(row["recorded"]), row["recorded_name"], bool(row["woke"]))


@dataclass(frozen=True, slots=True)
class Child(_Row):
    """A child turn: the parent and the step that started it, its depth, agent and status."""

    turn_id: str
    parent_turn_id: str
    parent_step: int
    depth: int
    agent: str = ""
    status: str = ""


class WaitStore:
    """Parks, wakes, events and child turns, through the process's connections."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- parking (the claim's holder) ------------------------------------------------------

    def park(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: WaitKind,
        name: str,
        wake_at: datetime | None,
    ) -> bool:
        """Park the turn (False: what it waits for is there, its time has come, it was
        cancelled or the claim is gone: the caller finds out which)."""
        parked = self.db.value(
            "park_turn",
            turn_id=turn_id,
            epoch=epoch,
            step=step,
            kind=kind,
            name=name,
            wake_at=wake_at,
        )
        return bool(parked)

    def consume_event(self, turn_id: str, epoch: int, step: int, name: str) -> Event | None:
        """The event the wait at ``step`` consumed (before, or now), or None."""
        row = self.db.one("consume_event", turn_id=turn_id, epoch=epoch, step=step, name=name)
        return Event.from_row({**row, "consumed_step": step}) if row else None

    def depth(self, turn_id: str) -> int:
        """0 for a turn an application started, 1 for its child, and so on."""
        return int(self.db.value("turn_depth", turn_id=turn_id) or 0)

    def create_child(
        self,
        parent_turn_id: str,
        epoch: int,
        parent_step: int,
        *,
        turn_id: str,
        message: str,
        agent: str,
        queue: str,
        depth: int,
    ) -> tuple[bool, bool]:
        """(the parent's claim held, the child was created now)."""
        row = self.db.one(
            "create_child",
            parent_turn_id=parent_turn_id,
            epoch=epoch,
            parent_step=parent_step,
            turn_id=turn_id,
            message=self.db.sealer.text(message, Where(turn_id, "message")),
            agent=agent,
            queue=queue,
            depth=depth,
        )
        assert row is not None
        return bool(row["held"]), bool(row["created"])

    # -- waking ------------------------------------------------------------------------------

    def record_event(self, turn_id: str, event_id: str, name: str, payload: Any) -> Recorded:
        """Keep the event for the turn and wake the turn if it waits for that name, in one
        statement (``durable_agent_send_event``); the payload sealed when keys are set."""
        row = self.db.one(
            "record_event",
            turn_id=turn_id,
            event_id=event_id,
            name=name,
            payload=self.db.sealer.json(payload, Where(turn_id, "payload", key=event_id)),
        )
        return Recorded.from_row(row)

    def wake_due(self, batch: int = 500) -> list[str]:
        """Wake the parked turns whose time came (the sweeper)."""
        return [row["turn_id"] for row in self.db.run("wake_due", batch=batch)]

    def next_wake(self) -> datetime | None:
        """The earliest due time of a parked turn."""
        value: datetime | None = self.db.value("next_wake")
        return value

    def claim_send(self, turn_id: str, message_id: str) -> tuple[str, str, str] | None:
        """(session_id, turn_id, queue) if this caller is to send the woken turn."""
        row = self.db.one("claim_send", turn_id=turn_id, message_id=message_id)
        return (row["session_id"], row["turn_id"], row["queue"]) if row else None

    # -- reading -----------------------------------------------------------------------------

    def waits(self, turn_ids: list[str]) -> dict[str, Wait]:
        """What each of these parked turns waits for."""
        if not turn_ids:
            return {}
        rows = self.db.records("list_waits", Wait, turn_ids=turn_ids)
        return {w.turn_id: w for w in rows}

    def events(self, turn_id: str, limit: int = 1000) -> list[Event]:
        return self.db.records("list_events", Event, turn_id=turn_id, limit=limit)

    def open_children(self, turn_id: str) -> list[str]:
        return [row["turn_id"] for row in self.db.run("open_children", turn_id=turn_id)]

    def children_of(self, turn_ids: list[str]) -> list[Child]:
        if not turn_ids:
            return []
        return self.db.records("children_of", Child, turn_ids=turn_ids)

    def parent_of(self, turn_id: str) -> Child | None:
        row = self.db.one("parent_of", turn_id=turn_id)
        return Child.from_row({**row, "turn_id": turn_id}) if row else None
