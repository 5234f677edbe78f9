"""A journal row and a turn as the console shows them: plain values for the templates."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..journal import Step, Turn
from ..redact import redact


@dataclass(frozen=True, slots=True)
class StepRow:
    """One line of a turn's timeline."""

    step: int
    kind: str
    name: str
    label: str  # the tool's replay label, "" for a model call
    status: str  # "done", or "intent" (running, or cut short)
    epoch: int
    started: datetime
    duration_ms: float | None
    tokens: str  # "120 + 30" (prompt + completion) for a model call, "" otherwise
    how: str  # "run", "run; read back 2x", "interrupted", "running"
    uncertain: bool
    summary: str
    detail: str  # input and output, JSON, credentials redacted

    @property
    def dom_id(self) -> str:
        return f"step-{self.step}"


def step_row(step: Step, turn: Turn) -> StepRow:
    """The row of ``step`` in ``turn`` as recorded now."""
    duration = None
    if step.finished_at is not None:
        duration = (step.finished_at - step.created_at).total_seconds() * 1000
    output = step.output if isinstance(step.output, dict) else {}
    usage = output.get("usage") if step.kind == "model" else None
    tokens = ""
    if isinstance(usage, dict):
        tokens = f"{usage.get('prompt_tokens', 0)} + {usage.get('completion_tokens', 0)}"
    return StepRow(
        step=step.step,
        kind=step.kind,
        name=step.name,
        label=step.replay or "" if step.kind == "tool" else "",
        status=step.status,
        epoch=step.epoch,
        started=step.created_at,
        duration_ms=duration,
        tokens=tokens,
        how=how_it_ran(step, turn),
        uncertain=bool(output.get("uncertain"))
        or (step.status == "intent" and step.replay == "never" and not _live(step, turn)),
        summary=redact(step.summary(120)),
        detail=redact(json.dumps(_payloads(step), indent=1, default=str)),
    )


def _payloads(step: Step) -> dict[str, Any]:
    """A step's input and output; one that did not open is its mark, with why."""
    shown: dict[str, Any] = {"input": step.input, "output": step.output}
    for unopened in step.unreadable:
        shown[unopened.field] = f"{unopened.label} {unopened.detail}"
    return shown


def how_it_ran(step: Step, turn: Turn) -> str:
    """Whether the step ran or is running, and how many later claims read it back instead
    of running it again (every claim after the one that finished it)."""
    if step.status != "done":
        return "running" if _live(step, turn) else "interrupted"
    read_back = max(0, turn.lease_epoch - step.epoch)
    return f"run; read back {read_back}x" if read_back else "run"


def _live(step: Step, turn: Turn) -> bool:
    return turn.status == "running" and turn.lease_epoch == step.epoch


def shorten(text: str | None, width: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def as_json(value: Any) -> str:
    return redact(json.dumps(value, indent=1, default=str, ensure_ascii=False))
