"""Plain records read from the journal tables, and the names of their states."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Self, cast

from .sealing import Unreadable

if TYPE_CHECKING:
    from .ledger import Spend

Kind = Literal["model", "tool", "wait"]
Replay = Literal["safe", "never"]
StepStatus = Literal["intent", "done"]


class TurnStatus(StrEnum):
    """Where a turn is. ``done``, ``failed`` and ``cancelled`` are final.

    ``queued``: recorded, waiting for a worker (or deferred after a model outage);
    ``running``: claimed by a worker (its lease may have run out); ``waiting``: parked, with
    no claim, no lease and no message, until what it waits for comes (a person's decision on
    a tool call, a due time, an event, a child turn's end: see ``waits``); ``done``: it has
    its reply; ``failed``: it has its reason; ``cancelled``: stopped at a step boundary on request.
    """

    QUEUED = "queued"  # recorded, waiting for a worker (or deferred after a model outage)
    RUNNING = "running"  # claimed by a worker (its lease may have run out)
    WAITING = "waiting"  # parked (approval, sleep, event, child); no claim, no message
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped at a step boundary on request (see operate/cancel.py)


OPEN_STATUSES = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING})
FINAL_STATUSES = frozenset({TurnStatus.DONE, TurnStatus.FAILED, TurnStatus.CANCELLED})


class _Row:
    """Build a record from a database row (columns it does not know are ignored)."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        names = _FIELD_NAMES.get(cls)
        if names is None:  # dataclasses.fields() is slow: a journal load calls this per row
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cast(Any, cls)))
        return cls(**{name: row[name] for name in names if name in row})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class Turn(_Row):
    """One agent turn, as recorded in Postgres."""

    turn_id: str
    session_id: str
    seq: int
    status: TurnStatus
    message: str
    reply: str | None
    error: str | None
    attempts: int
    crashes: int
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    not_before: datetime | None = None
    enqueued_at: datetime | None = None
    queue: str = ""
    message_id: str | None = None
    received_message_id: str | None = None
    received_at: datetime | None = None
    received_by: str | None = None
    agent: str = "default"
    agent_digest: str | None = None
    agent_spec: dict[str, Any] | None = None
    agent_changes: str | None = None
    spend: Spend | None = None  # the spend ledger of the turn, from get_turn and list_turns
    unreadable: tuple[Unreadable, ...] = ()
    """The payloads (message, reply) a marked read could not open (``Database.run_marked``:
    listings, the claim, cancel); each is None here ("" for the message), never garbage."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TurnStatus(self.status))
        if self.unreadable:
            object.__setattr__(self, "unreadable", tuple(self.unreadable))
            if self.message is None:
                object.__setattr__(self, "message", "")

    def unreadable_field(self, name: str) -> Unreadable | None:
        """Why ``name`` (message, reply) did not open, or None."""
        return next((u for u in self.unreadable if u.field == name), None)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "seq": self.seq,
            "status": str(self.status),
            "message": self.message,
            "reply": self.reply,
            "error": self.error,
            "attempts": self.attempts,
            "crashes": self.crashes,
            "lease_epoch": self.lease_epoch,
            "queue": self.queue,
            "agent": self.agent,
            "agent_digest": self.agent_digest,
            "agent_changes": self.agent_changes,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            **({"spend": self.spend.as_json()} if self.spend is not None else {}),
            **(
                {
                    "message": None if self.unreadable_field("message") else self.message,
                    "unreadable": {u.field: u.as_json() for u in self.unreadable},
                }
                if self.unreadable
                else {}
            ),
        }


@dataclass(frozen=True, slots=True)
class TurnFilter:
    """Which turns a listing shows (None: any)."""

    status: TurnStatus | None = None
    agent: str | None = None
    session_id: str | None = None
    queue: str | None = None
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before

    def params(self) -> dict[str, Any]:
        return {
            "status": None if self.status is None else str(self.status),
            "agent": self.agent,
            "session_id": self.session_id,
            "queue": self.queue,
            "since": self.since,
            "until": self.until,
        }


@dataclass(frozen=True, slots=True)
class WorkerSeen(_Row):
    """A worker process as the turns table shows it (``host:pid#token``)."""

    worker: str
    claims_held: int  # live claims
    claims_expired: int  # claims whose lease ran out and that nobody took over yet
    lease_until: datetime | None  # the furthest lease it holds (renewed each third of it)
    received: int  # messages it received within the window asked for
    last_received: datetime | None
    now: datetime  # Postgres' clock when read


@dataclass(frozen=True, slots=True)
class AgentSeen(_Row):
    """An agent and a digest its turns ran with (None: not run yet)."""

    agent: str
    agent_digest: str | None
    turns: int
    newest: datetime
    resumed_changed: int  # turns resumed under a changed agent


@dataclass(frozen=True, slots=True)
class Step(_Row):
    """One journal row: the intent of a call and, once done, its outcome."""

    turn_id: str
    step: int
    kind: Kind
    name: str
    input: dict[str, Any]
    replay: Replay | None
    status: StepStatus
    output: Any
    epoch: int
    created_at: datetime
    finished_at: datetime | None
    blob: str | None = None
    unreadable: tuple[Unreadable, ...] = ()
    """The payloads (input, output) a marked read could not open; each is None here."""

    def __post_init__(self) -> None:
        if self.unreadable:
            object.__setattr__(self, "unreadable", tuple(self.unreadable))

    def summary(self, width: int = 70) -> str:
        """One line for the step's outcome."""
        if self.unreadable:
            return " ".join(f"{u.field} {u.label}" for u in self.unreadable)
        if self.status != "done":
            return "(waiting)" if self.kind == "wait" else "(no outcome recorded)"
        output = self.output
        if self.kind == "model" and isinstance(output, dict):
            message = output.get("message") or {}
            calls = message.get("tool_calls") or []
            if calls:
                text = "calls " + ", ".join(
                    f"{c['function']['name']}({c['function']['arguments']})" for c in calls
                )
            else:
                text = f"replies {message.get('content')!r}"
        elif isinstance(output, dict) and "content" in output:
            text = str(output["content"])
        else:
            text = json.dumps(output)
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 1] + "…"

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "kind": self.kind,
            "name": self.name,
            "replay": self.replay,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "epoch": self.epoch,
            "blob": self.blob,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            **(
                {"unreadable": {u.field: u.as_json() for u in self.unreadable}}
                if self.unreadable
                else {}
            ),
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A successful claim: this worker owns the turn at ``epoch`` until the lease runs out."""

    turn: Turn
    epoch: int
    owner: str


class Ended(NamedTuple):
    """A turn just ended: where it was, and the next unfinished turn of its session
    (``(session_id, turn_id, queue)``), which may run now."""

    session_id: str
    seq: int
    next_turn: tuple[str, str, str] | None = None
    status: str = ""  # as it ended: a turn ending done that was cancelled ends "cancelled"


RefusalReason = Literal[
    "finished", "leased", "deferred", "waiting", "elsewhere", "parked", "key_busy"
]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a delivery did not get the turn."""

    reason: RefusalReason
    detail: str


@dataclass(frozen=True)
class EncodedOutcome:
    """A step's outcome ready to write: its JSON, or the hash of the blob that holds it."""

    step: int
    output: str | None
    blob: str | None
