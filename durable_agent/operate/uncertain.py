"""The uncertain-effects inbox: every ``never`` call whose outcome is unknown.

A ``never`` call is uncertain when it was interrupted (a worker died between its intent and
its outcome; the model was told it may or may not have happened), when it raised, or when
its intent was left behind by a turn that ended (cancelled or failed while the call ran).
Each one is an operator's question: did the refund go through?

``list_uncertain`` shows them with the turn, step, tool, arguments, idempotency key, when,
and what the model did next (checked with a safe tool? retried with the same key? did not
retry?), read from the rest of the turn's journal. ``resolve`` records an operator's
verdict (happened, not happened, ignored) with who and when, in ``resolutions``; the journal
row is never changed, and the latest verdict counts.

New ones reach a pager through the hooks of ``paging.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..errors import InvalidArgument, TurnNotFound
from ..inputs import check_count, check_id
from ..journal import JournalStore, OperatorStore, Row, Step
from .cancel import check_by, check_note

log = logging.getLogger(__name__)

Verdict = Literal["happened", "not_happened", "ignored"]
VERDICTS: tuple[Verdict, ...] = ("happened", "not_happened", "ignored")


@dataclass(frozen=True, slots=True)
class Resolution:
    verdict: Verdict
    note: str | None
    resolved_by: str
    resolved_at: datetime


@dataclass(frozen=True, slots=True)
class UncertainEffect:
    """One ``never`` call whose outcome is unknown, and what followed it."""

    turn_id: str
    session_id: str
    step: int
    tool: str
    arguments: Any
    idempotency_key: str | None
    at: datetime
    how: str  # "interrupted", "raised" or "left unfinished"
    turn_status: str
    next: str  # what the model did next, in words
    checked: list[str] = field(default_factory=list)  # safe tools called before any retry
    retry: str | None = None  # "same key" or "new key"
    retry_step: int | None = None
    resolution: Resolution | None = None
    agent: str = "default"

    @property
    def notice_id(self) -> str:
        """``<turn_id>:<step>``: the same for every time a hook is told of this effect (it
        is told at least once), to deduplicate pages with."""
        return f"{self.turn_id}:{self.step}"

    def as_json(self) -> dict[str, Any]:
        r = self.resolution
        return {
            "notice_id": self.notice_id,
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "agent": self.agent,
            "step": self.step,
            "tool": self.tool,
            "arguments": self.arguments,
            "idempotency_key": self.idempotency_key,
            "at": self.at.isoformat(),
            "how": self.how,
            "turn_status": self.turn_status,
            "next": self.next,
            "checked": self.checked,
            "retry": self.retry,
            "retry_step": self.retry_step,
            "resolution": None
            if r is None
            else {
                "verdict": r.verdict,
                "note": r.note,
                "resolved_by": r.resolved_by,
                "resolved_at": r.resolved_at.isoformat(),
            },
        }


def list_uncertain(
    store: OperatorStore,
    journal: JournalStore,
    *,
    since: datetime | None = None,
    include_resolved: bool = False,
    turn_id: str | None = None,
    agent: str | None = None,
    limit: int = 1000,
) -> list[UncertainEffect]:
    """Uncertain effects, oldest first: unresolved ones (``include_resolved``: all), of one
    turn or of one agent's turns if asked. Raises TurnNotFound for an unknown ``turn_id``."""
    if turn_id is not None:
        check_id("turn_id", turn_id)
        if journal.find_turn(turn_id, marked=True) is None:  # not an empty inbox
            raise TurnNotFound(turn_id)
    if agent is not None:
        check_id("agent", agent)
    check_count("limit", limit, 10_000)
    if since is not None and (not isinstance(since, datetime) or since.tzinfo is None):
        raise InvalidArgument("since must be a timezone-aware datetime")
    rows = store.uncertain_effects(
        since=since, turn_id=turn_id, agent=agent, include_resolved=include_resolved, limit=limit
    )
    return effects_of(journal, rows)


def resolve(
    store: OperatorStore,
    journal: JournalStore,
    turn_id: str,
    step: int,
    verdict: Verdict,
    *,
    note: str | None = None,
    by: str | None = None,
    replace: bool = False,
) -> UncertainEffect:
    """Record an operator's verdict on the uncertain effect at (turn, step); the journal is
    not touched. An effect that has a verdict keeps it unless ``replace`` (the earlier one
    stays on record; the latest counts). Raises TurnNotFound, or InvalidArgument when that
    step is not uncertain or has a verdict and ``replace`` is not given."""
    check_id("turn_id", turn_id)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidArgument(f"step must be a whole number, 0 or more, got {step!r}")
    if verdict not in VERDICTS:
        raise InvalidArgument(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    note = check_note("note", note)
    who = check_by(by)
    journal.get_turn(turn_id)  # TurnNotFound
    found = store.uncertain_effects(turn_id=turn_id, step=step, include_resolved=True, limit=1)
    if not found:
        raise InvalidArgument(f"step {step} of turn {turn_id} is not an uncertain effect")
    if store.record_resolution(turn_id, step, verdict, note, who, replace=replace) is None:
        before = effects_of(
            journal,
            store.uncertain_effects(turn_id=turn_id, step=step, include_resolved=True, limit=1),
        )[0].resolution
        assert before is not None
        raise InvalidArgument(
            f"step {step} of turn {turn_id} was already resolved {before.verdict} by "
            f"{before.resolved_by} at {before.resolved_at.isoformat()}; "
            "pass --replace (replace=True) to record a new verdict"
        )
    log.info("uncertain effect %s step %d resolved %s by %s", turn_id, step, verdict, who)
    rows = store.uncertain_effects(turn_id=turn_id, step=step, include_resolved=True, limit=1)
    return effects_of(journal, rows)[0]


# -- what the model did next -----------------------------------------------------------------


def effects_of(journal: JournalStore, rows: list[Row]) -> list[UncertainEffect]:
    journals: dict[str, list[Step]] = {}
    effects = []
    for row in rows:
        turn_id = row["turn_id"]
        if turn_id not in journals:
            journals[turn_id] = journal.load_journal(turn_id)
        effects.append(_effect(row, journals[turn_id]))
    return effects


def _effect(row: Row, journal: list[Step]) -> UncertainEffect:
    intent = row["input"] or {}
    output = row["output"] if isinstance(row["output"], dict) else {}
    key = intent.get("idempotency_key")
    if row["status"] == "intent":
        how = "left unfinished"
    elif output.get("error"):
        how = "raised"
    else:
        how = "interrupted"
    checked: list[str] = []
    retry: str | None = None
    retry_step: int | None = None
    for later in journal:
        if later.step <= row["step"] or later.kind != "tool":
            continue
        if later.name == row["tool"]:
            retry = "same key" if later.input.get("idempotency_key") == key else "new key"
            retry_step = later.step
            break
        if later.replay == "safe":
            checked.append(f"{later.name} (step {later.step})")
    parts = [f"checked with {', '.join(checked)}"] if checked else []
    if retry is not None:
        parts.append(f"retried with the {retry} (step {retry_step})")
    elif row["turn_status"] in ("done", "failed", "cancelled"):
        parts.append(f"did not retry; the turn ended {row['turn_status']}")
    else:
        parts.append(f"no retry yet; the turn is {row['turn_status']}")
    resolution = (
        Resolution(row["verdict"], row["note"], row["resolved_by"], row["resolved_at"])
        if row["verdict"] is not None
        else None
    )
    return UncertainEffect(
        turn_id=row["turn_id"],
        session_id=row["session_id"],
        step=row["step"],
        tool=row["tool"],
        arguments=intent.get("arguments"),
        idempotency_key=key,
        at=row["created_at"],
        how=how,
        turn_status=row["turn_status"],
        next=", then ".join(parts),
        checked=checked,
        retry=retry,
        retry_step=retry_step,
        resolution=resolution,
        agent=row.get("agent") or "default",
    )
