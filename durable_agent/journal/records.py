"""Plain records read from the journal tables."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Kind = Literal["model", "tool"]
Replay = Literal["safe", "never"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One agent turn, as recorded in Postgres."""

    turn_id: str
    session_id: str
    seq: int
    status: str
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

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")


@dataclass(frozen=True, slots=True)
class Step:
    """One journal row: the intent of a call and, once done, its outcome."""

    turn_id: str
    step: int
    kind: Kind
    name: str
    input: dict[str, Any]
    replay: Replay | None
    status: Literal["intent", "done"]
    output: Any
    epoch: int
    created_at: datetime
    finished_at: datetime | None
    blob: str | None = None

    def summary(self, width: int = 70) -> str:
        """One line for the step's outcome."""
        if self.status != "done":
            return "(no outcome recorded)"
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
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A successful claim: this worker owns the turn at ``epoch`` until the lease runs out."""

    turn: Turn
    epoch: int
    owner: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a delivery did not get the turn, and when it is worth checking again."""

    reason: Literal["not_found", "finished", "leased", "deferred", "waiting", "poisoned"]
    detail: str
    retry_in: float | None = None
