"""Operating turns: cancellations, approvals, resolutions of uncertain effects, pruning.

One method per named query (``sql/queries.sql``, section "operating it"). The tables live
beside the journal and never change it: a resolution is a verdict about a journal row, a
decision on an approval is read by the runner when it reaches the call again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .audit import Action, AuditEntry, Interface, audit_params
from .db import Database, Row, _Connected
from .notify import announce
from .records import Ended, Turn, _Row
from .sealing import Where


def decide_with_audit(
    tx: _Connected, turn_id: str, step: int, decision: str, reason: str | None, decided_by: str
) -> Row | None:
    """Decide a pending call on ``tx`` and, when one was pending, append the decision's audit
    entry in the same transaction: the decision's row (session_id, turn_id, queue), or None.
    Shared by the operator's store and a decision in the application's transaction."""
    row = tx.one(
        "decide_approval",
        turn_id=turn_id,
        step=step,
        decision=decision,
        reason=reason,
        decided_by=decided_by,
    )
    if row is not None:
        action: Action = "approve" if decision == "approved" else "deny"
        tx.run(
            "record_audit",
            **audit_params(
                action,
                decided_by,
                turn_id=turn_id,
                step=step,
                before={"decision": None, "turn_status": "waiting"},
                after={"decision": decision, "reason": reason, "turn_status": "queued"},
            ),
        )
    return row


@dataclass(frozen=True, slots=True)
class Cancellation(_Row):
    """Who asked a turn to stop, why and when."""

    turn_id: str
    requested_by: str
    reason: str | None
    requested_at: datetime


@dataclass(frozen=True, slots=True)
class Approval(_Row):
    """A tool call that waits for (or got) a person's decision."""

    turn_id: str
    step: int
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str | None
    requested_at: datetime
    decision: str | None
    reason: str | None
    decided_by: str | None
    decided_at: datetime | None
    turn_status: str | None = None  # in listings

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "step": self.step,
            "tool": self.tool,
            "arguments": self.arguments,
            "idempotency_key": self.idempotency_key,
            "requested_at": self.requested_at.isoformat(),
            "decision": self.decision,
            "reason": self.reason,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            "turn_status": self.turn_status,
        }


@dataclass(frozen=True, slots=True)
class PruneCount:
    """Finished turns (and their journal rows) deleted or to delete; old turns kept for
    their unresolved uncertain effects (``kept``) and because their session has an open
    turn (``kept_open_session``: counted there whatever their effects); blobs deleted."""

    turns: int = 0
    steps: int = 0
    kept: int = 0
    blobs: int = 0
    kept_open_session: int = 0


def _ended(row: Row | None) -> Ended | None:
    if row is None:
        return None
    following = (
        (row["session_id"], row["next_turn_id"], row["next_queue"]) if row["next_turn_id"] else None
    )
    return Ended(row["session_id"], row["seq"], following)


class OperatorStore:
    """The queries of cancel, prune, the uncertain-effects inbox and approvals."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- cancel ----------------------------------------------------------------------------

    def find_turn(self, turn_id: str) -> Turn | None:
        """The turn as recorded now, its payloads marked where they do not open (cancel
        needs only its ids and status: a turn nobody can read can still be stopped)."""
        row = self.db.one_marked("find_turn", turn_id=turn_id)
        return Turn.from_row(row) if row else None

    def request_cancel(self, turn_id: str, requested_by: str, reason: str | None) -> bool:
        """Record the request (and in the same transaction its audit entry); False if the
        turn is not open or was asked before."""
        with self.db.transaction() as tx:
            row = tx.one(
                "request_cancel", turn_id=turn_id, requested_by=requested_by, reason=reason
            )
            if row is not None:
                tx.run(
                    "record_audit",
                    **audit_params(
                        "cancel",
                        requested_by,
                        turn_id=turn_id,
                        before={"cancel_requested": False},
                        after={"cancel_requested": True, "reason": reason},
                    ),
                )
        return row is not None

    def open_children(self, turn_id: str) -> list[str]:
        """The open child turns of a turn (a cancel of the parent cancels them)."""
        return [row["turn_id"] for row in self.db.run("open_children", turn_id=turn_id)]

    def find_cancellation(self, turn_id: str) -> Cancellation | None:
        row = self.db.one("find_cancellation", turn_id=turn_id)
        return Cancellation.from_row(row) if row else None

    def end_unheld_cancelled(self, turn_id: str) -> Ended | None:
        """End a cancelled turn no worker holds; None if a worker holds it (or it ended)."""
        return _ended(self.db.one("end_unheld_cancelled", turn_id=turn_id))

    def end_claimed_cancelled(self, turn_id: str, epoch: int) -> Ended | None:
        """The holder at ``epoch`` ends its cancelled turn; None if the epoch moved on."""
        return _ended(self.db.one("end_claimed_cancelled", turn_id=turn_id, epoch=epoch))

    # -- prune -----------------------------------------------------------------------------

    def prune_preview(self, older_than_seconds: float) -> PruneCount:
        row = self.db.one("prune_preview", older_than=older_than_seconds)
        assert row is not None
        return PruneCount(
            turns=row["turns"],
            steps=row["steps"],
            kept=row["kept"],
            kept_open_session=row["kept_open"],
        )

    def prune_turns(self, older_than_seconds: float, batch: int) -> PruneCount:
        """Delete one batch of prunable turns (their journal goes with them)."""
        row = self.db.one("prune_turns", older_than=older_than_seconds, batch=batch)
        assert row is not None
        return PruneCount(turns=row["turns"], steps=row["steps"] or 0)

    def prune_blobs(self, grace_seconds: float, batch: int) -> int:
        """Delete one batch of blobs no journal row refers to; how many."""
        return len(self.db.run("prune_blobs", grace=grace_seconds, batch=batch))

    # -- uncertain effects -----------------------------------------------------------------

    def uncertain_effects(
        self,
        *,
        since: datetime | None = None,
        turn_id: str | None = None,
        step: int | None = None,
        agent: str | None = None,
        include_resolved: bool = False,
        limit: int = 1000,
    ) -> list[Row]:
        return self.db.run(
            "uncertain_effects",
            since=since,
            turn_id=turn_id,
            step=step,
            agent=agent,
            include_resolved=include_resolved,
            limit=limit,
        )

    def record_resolution(
        self,
        turn_id: str,
        step: int,
        verdict: str,
        note: str | None,
        resolved_by: str,
        *,
        replace: bool = False,
    ) -> datetime | None:
        """When the verdict was recorded (with its audit entry, in one transaction); None
        when the effect had one and not ``replace``."""
        with self.db.transaction() as tx:
            earlier = tx.run(
                "uncertain_effects",
                since=None,
                turn_id=turn_id,
                step=step,
                agent=None,
                include_resolved=True,
                limit=1,
            )
            row = tx.one(
                "record_resolution",
                turn_id=turn_id,
                step=step,
                verdict=verdict,
                note=note,
                resolved_by=resolved_by,
                replace=replace,
            )
            if row is not None:
                before = earlier[0] if earlier else {}
                tx.run(
                    "record_audit",
                    **audit_params(
                        "resolve",
                        resolved_by,
                        turn_id=turn_id,
                        step=step,
                        before={"verdict": before.get("verdict"), "note": before.get("note")},
                        after={"verdict": verdict, "note": note},
                    ),
                )
        if row is None:
            return None
        resolved_at: datetime = row["resolved_at"]
        return resolved_at

    def claim_uncertain_notices(
        self, hooks: list[str], owner: str, hold_seconds: float, batch: int
    ) -> list[tuple[str, int, str]]:
        """(turn_id, step, hook) of untold effects, claimed by ``owner`` for a while."""
        rows = self.db.run(
            "claim_uncertain_notices", hooks=hooks, owner=owner, hold=hold_seconds, batch=batch
        )
        return [(r["turn_id"], r["step"], r["hook"]) for r in rows]

    def notice_told(self, turn_id: str, step: int, hook: str) -> None:
        self.db.run("notice_told", turn_id=turn_id, step=step, hook=hook)

    def release_notice(self, turn_id: str, step: int, hook: str, owner: str) -> None:
        self.db.run("release_notice", turn_id=turn_id, step=step, hook=hook, owner=owner)

    def announce(self, *payloads: str) -> None:
        """Wake the watchers of a turn after a write here ended it (see ``notify.py``)."""
        announce(self.db, *payloads)

    # -- approvals -------------------------------------------------------------------------

    def find_approval(self, turn_id: str, step: int) -> Approval | None:
        row = self.db.one("find_approval", turn_id=turn_id, step=step)
        return Approval.from_row(row) if row else None

    def list_approvals(
        self, *, turn_id: str | None = None, include_decided: bool = False, limit: int = 1000
    ) -> list[Approval]:
        rows = self.db.run(
            "list_approvals", turn_id=turn_id, include_decided=include_decided, limit=limit
        )
        return [Approval.from_row(row) for row in rows]

    def park_for_approval(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        tool: str,
        arguments: dict[str, Any],
        idempotency_key: str | None,
    ) -> bool:
        """Park the turn at this call; False if the epoch moved on or it was cancelled."""
        row = self.db.one(
            "park_for_approval",
            turn_id=turn_id,
            epoch=epoch,
            step=step,
            tool=tool,
            arguments=self.db.sealer.json(arguments, Where(turn_id, "arguments", step)),
            idempotency_key=idempotency_key,
        )
        return row is not None

    def decide_approval(
        self, turn_id: str, step: int, decision: str, reason: str | None, decided_by: str
    ) -> tuple[str, str, str] | None:
        """Decide a pending call of a waiting turn (with its audit entry, in one
        transaction); (session_id, turn_id, queue) to send, or None when nothing was
        pending."""
        with self.db.transaction() as tx:
            row = decide_with_audit(tx, turn_id, step, decision, reason, decided_by)
        return (row["session_id"], row["turn_id"], row["queue"]) if row else None

    # -- the audit trail ---------------------------------------------------------------------

    def audit(
        self,
        action: Action,
        actor: str,
        *,
        turn_id: str | None = None,
        step: int | None = None,
        before: Any = None,
        after: Any = None,
        interface: Interface | None = None,
    ) -> None:
        """Append one entry to the audit trail (an action of its own statement: prune,
        rekey, a changed agent)."""
        self.db.run(
            "record_audit",
            **audit_params(
                action,
                actor,
                turn_id=turn_id,
                step=step,
                before=before,
                after=after,
                interface=interface,
            ),
        )

    def audit_entries(
        self,
        *,
        turn_id: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The audit trail, newest first."""
        rows = self.db.run(
            "audit_entries", turn_id=turn_id, action=action, since=since, limit=limit
        )
        return [AuditEntry.from_row(row) for row in rows]
