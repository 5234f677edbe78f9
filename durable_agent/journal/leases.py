"""Claims on turns: take, renew, give back, finish.

A claim is one statement that takes the turn when its lease is free or expired, moves
``lease_epoch`` on and counts the attempt; every later write of that worker names the epoch
and fails once another claim moved it on. A turn runs only after every earlier turn of its
session has finished, so the conversation it is built from can no longer change.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import text

from ..errors import TurnNotFound
from .db import Database
from .holders import holder_is_dead, host_token
from .records import Claim, Refusal, Turn
from .store import _TURN_COLUMNS, JournalStore

log = logging.getLogger(__name__)

_CLAIM = text(
    f"""
UPDATE turns AS t SET
    status = 'running',
    lease_owner = :owner,
    lease_epoch = t.lease_epoch + 1,
    attempts = t.attempts + 1,
    crashes = t.crashes
        + CASE WHEN t.lease_owner IS NOT NULL AND t.lease_owner <> :owner THEN 1 ELSE 0 END,
    lease_expires_at = now() + make_interval(secs => :lease_seconds),
    not_before = NULL,
    updated_at = now()
WHERE t.turn_id = :turn_id
  AND t.status IN ('queued', 'running')
  AND (t.lease_owner IS NULL OR t.lease_owner = :owner OR t.lease_expires_at <= now())
  AND (t.not_before IS NULL OR t.not_before <= now())
  AND NOT EXISTS (
      SELECT 1 FROM turns AS earlier
      WHERE earlier.session_id = t.session_id AND earlier.seq < t.seq
        AND earlier.status IN ('queued', 'running'))
RETURNING {", ".join("t." + c.strip() for c in _TURN_COLUMNS.split(","))}
"""
)

_RENEW = text(
    """
UPDATE turns SET lease_expires_at = now() + make_interval(secs => :lease_seconds)
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING lease_expires_at
"""
)

_END = text(
    """
UPDATE turns SET status = :status, reply = :reply, error = :error, lease_owner = NULL,
    lease_expires_at = NULL, finished_at = now(), updated_at = now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING session_id, seq
"""
)

_RELEASE = text(
    """
UPDATE turns SET status = 'queued', error = :error, lease_owner = NULL, lease_expires_at = NULL,
    not_before = now() + make_interval(secs => :delay), updated_at = now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING turn_id
"""
)

_END_DEAD_CLAIM = text(
    """
UPDATE turns SET lease_expires_at = now(), updated_at = now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND lease_owner = :owner
  AND status = 'running' AND lease_expires_at > now()
RETURNING turn_id
"""
)

_LOCAL_CLAIMS = text(
    """
SELECT turn_id, lease_owner, lease_epoch FROM turns
WHERE status = 'running' AND lease_expires_at > now() AND lease_owner LIKE :pattern
"""
)

_STILL_HELD = text(
    """
SELECT lease_epoch = :epoch AND status = 'running' AND lease_expires_at > now()
FROM turns WHERE turn_id = :turn_id
"""
)

_EARLIER_OPEN = text(
    """
SELECT turn_id FROM turns
WHERE session_id = :session_id AND seq < :seq AND status IN ('queued', 'running')
ORDER BY seq LIMIT 1
"""
)


class Leases:
    """Claim, renew, release and end turns, fenced by epoch."""

    def __init__(
        self, db: Database, store: JournalStore, *, end_dead_local_claims: bool = True
    ) -> None:
        self.db = db
        self.store = store
        self.end_dead_local_claims = end_dead_local_claims

    def claim(self, turn_id: str, owner: str, lease_seconds: float) -> Claim | Refusal:
        params = {"turn_id": turn_id, "owner": owner, "lease_seconds": lease_seconds}
        row = self.db.execute(_CLAIM, params).one_or_none()
        held = None
        if row is None:
            held = self.store.find_turn(turn_id)
            if (
                held is not None
                and self.end_dead_local_claims
                and self.end_claim_of_dead_holder(turn_id, held.lease_owner, held.lease_epoch)
            ):
                row = self.db.execute(_CLAIM, params).one_or_none()
                held = None
        if row is not None:
            turn = Turn(**row._mapping)
            return Claim(turn=turn, epoch=turn.lease_epoch, owner=owner)
        return self._why_not(turn_id, lease_seconds, held)

    def end_claim_of_dead_holder(self, turn_id: str, owner: str | None, epoch: int) -> bool:
        """End a live claim at once if its holder is a process of this machine that died."""
        if not holder_is_dead(owner):
            return False
        ended = self.db.execute(
            _END_DEAD_CLAIM, {"turn_id": turn_id, "owner": owner, "epoch": epoch}
        ).one_or_none()
        if ended is not None:
            log.warning(
                "turn %s: its holder %s (epoch %d) died on this machine; claim ended early",
                turn_id,
                owner,
                epoch,
            )
        return ended is not None

    def end_dead_local_holders(self) -> list[str]:
        """End every live claim held by a dead process of this machine (a sweeper pass)."""
        token = host_token()
        if token is None or not self.end_dead_local_claims:
            return []
        rows = self.db.execute(_LOCAL_CLAIMS, {"pattern": f"%#{token}"}).all()
        return [
            row.turn_id
            for row in rows
            if self.end_claim_of_dead_holder(row.turn_id, row.lease_owner, row.lease_epoch)
        ]

    def _why_not(self, turn_id: str, lease_seconds: float, turn: Turn | None = None) -> Refusal:
        """Why the claim failed, from the turn as it was just read (or read now)."""
        turn = turn or self.store.find_turn(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        now = self._now()
        if turn.finished:
            return Refusal("finished", f"turn {turn_id} is already {turn.status}")
        if turn.lease_owner is not None and turn.lease_expires_at and turn.lease_expires_at > now:
            left = (turn.lease_expires_at - now).total_seconds()
            return Refusal(
                "leased",
                f"turn {turn_id} is held by {turn.lease_owner} (epoch {turn.lease_epoch}) "
                f"for {left:.1f}s more",
                retry_in=left + 0.5,
            )
        earlier = self.db.execute(
            _EARLIER_OPEN, {"session_id": turn.session_id, "seq": turn.seq}
        ).scalar_one_or_none()
        if earlier is not None:
            return Refusal(
                "waiting",
                f"turn {turn_id} waits for the earlier turn {earlier} of its session",
                retry_in=max(1.0, lease_seconds / 3),
            )
        not_before = self._not_before(turn_id)
        if not_before is not None and not_before > now:
            left = (not_before - now).total_seconds()
            return Refusal("deferred", f"turn {turn_id} is deferred for {left:.1f}s", left)
        # The state moved between the claim and this look: worth an immediate second try.
        return Refusal("leased", f"turn {turn_id} changed hands just now", retry_in=0.5)

    def _now(self) -> datetime:
        value = self.db.execute(text("SELECT now()")).scalar_one()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    def _not_before(self, turn_id: str) -> datetime | None:
        return self.db.execute(
            text("SELECT not_before FROM turns WHERE turn_id = :turn_id"), {"turn_id": turn_id}
        ).scalar_one_or_none()

    def renew(self, turn_id: str, epoch: int, lease_seconds: float) -> bool:
        """Extend the lease; False when the epoch moved on (the turn was taken over)."""
        row = self.db.execute(
            _RENEW, {"turn_id": turn_id, "epoch": epoch, "lease_seconds": lease_seconds}
        ).one_or_none()
        return row is not None

    def still_held(self, turn_id: str, epoch: int) -> bool:
        """Does this epoch still own an unexpired lease on the turn?"""
        held = self.db.execute(_STILL_HELD, {"turn_id": turn_id, "epoch": epoch}).scalar()
        return bool(held)

    def finish(self, turn_id: str, epoch: int, reply: str) -> tuple[str, int] | None:
        """Record the reply and end the turn as done; None if the epoch moved on."""
        return self._end(turn_id, epoch, "done", reply, None)

    def fail(self, turn_id: str, epoch: int, error: str) -> tuple[str, int] | None:
        """End the turn as failed with a reason; None if the epoch moved on."""
        return self._end(turn_id, epoch, "failed", None, error)

    def _end(
        self, turn_id: str, epoch: int, status: str, reply: str | None, error: str | None
    ) -> tuple[str, int] | None:
        row = self.db.execute(
            _END,
            {"turn_id": turn_id, "epoch": epoch, "status": status, "reply": reply, "error": error},
        ).one_or_none()
        return (row.session_id, row.seq) if row else None

    def release(self, turn_id: str, epoch: int, delay_seconds: float, error: str | None) -> bool:
        """Give the turn back (queued, journal kept) to be claimed again after a delay."""
        row = self.db.execute(
            _RELEASE,
            {"turn_id": turn_id, "epoch": epoch, "delay": delay_seconds, "error": error},
        ).one_or_none()
        return row is not None
