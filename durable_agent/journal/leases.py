"""Claims on turns: take, renew, give back, finish.

A claim is one statement that takes the turn when its lease is free or expired, moves
``lease_epoch`` on and counts the attempt; every later write of that worker names the epoch
and fails once another claim moved it on. A turn runs only after every earlier turn of its
session has finished, so the conversation it is built from can no longer change.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from ..errors import TurnNotFound
from ..redact import redact
from .db import Database, Row
from .holders import holder_is_dead, host_token
from .notify import announce
from .passes import LockedPass, locked_pass
from .records import Claim, EncodedOutcome, Ended, Refusal, Turn, TurnStatus
from .sealing import Where

log = logging.getLogger(__name__)


KEY_WAIT_SECONDS = 30.0
"""The longest a turn waits for a slot of its concurrency key before the sweeper sends it
again (a turn of its key that ends wakes the oldest waiting one at once)."""


class Leases:
    """Claim, renew, release and end turns, fenced by epoch."""

    def __init__(
        self, db: Database, *, end_dead_local_claims: bool = True, key_limit: int | None = None
    ) -> None:
        self.db = db
        self.end_dead_local_claims = end_dead_local_claims
        self.key_limit = key_limit  # turns of one concurrency key running at once (None: any)

    def claim(
        self,
        turn_id: str,
        owner: str,
        lease_seconds: float,
        queues: list[str] | None = None,
        agents: str | None = None,
    ) -> Claim | Refusal:
        """Take the turn for ``owner``, or say why not. With ``queues``, only a turn that
        belongs to one of them is taken ("elsewhere" otherwise). ``agents``: the claimer's
        agents' digests and specs as JSON (``AgentBook.served_specs``), recorded on the turn
        by its first claim.

        The turn's message is opened marked: one that does not open (a key this worker
        lacks, a tampered value) is in ``claim.turn.unreadable``, for the worker to decide
        (the claim is taken either way, so the worker can end or release it)."""
        row = self._claim(turn_id, owner, lease_seconds, queues, agents)
        if row is None:
            state = self.db.one_marked("claim_refusal", turn_id=turn_id, key_limit=self.key_limit)
            if state is None:
                raise TurnNotFound(turn_id)
            if not (
                self.end_dead_local_claims
                and self.end_claim_of_dead_holder(
                    turn_id, state["lease_owner"], state["lease_epoch"]
                )
            ):
                return _refusal(state, queues)
            row = self._claim(turn_id, owner, lease_seconds, queues, agents)
            if row is None:
                state = self.db.one_marked(
                    "claim_refusal", turn_id=turn_id, key_limit=self.key_limit
                )
                if state is None:
                    raise TurnNotFound(turn_id)
                return _refusal(state, queues)
        turn = Turn.from_row(row)
        return Claim(turn=turn, epoch=turn.lease_epoch, owner=owner)

    def _claim(
        self,
        turn_id: str,
        owner: str,
        lease_seconds: float,
        queues: list[str] | None,
        agents: str | None,
    ) -> Row | None:
        return self.db.one_marked(
            "claim_turn",
            turn_id=turn_id,
            owner=owner,
            lease_seconds=lease_seconds,
            queues=queues,
            agents=agents,
            key_limit=self.key_limit,
        )

    def wait_for_key(self, turn_id: str, delay_seconds: float = KEY_WAIT_SECONDS) -> None:
        """A turn refused for its concurrency key waits (queued, no claim) until a turn of
        its key ends (``wake_next_of_key``), or ``delay_seconds`` at most."""
        self.db.one("wait_for_key", turn_id=turn_id, delay=delay_seconds)

    def admit_new_keyed(self, turn_id: str, wait_seconds: float = KEY_WAIT_SECONDS) -> bool:
        """A new turn of a concurrency key: send it now (True), or let it wait for a slot,
        with no message, until a turn of its key ends and wakes it (False). Marked waiting
        first, so that an end in between wakes it rather than missing it."""
        self.wait_for_key(turn_id, wait_seconds)
        if not self.db.value("key_admits", turn_id=turn_id, key_limit=self.key_limit):
            return False
        self.db.one("unwait_key", turn_id=turn_id)
        return True

    def wake_next_of_key(self, turn_id: str) -> tuple[str, str, str] | None:
        """A turn of some key ended: the oldest turn of that key still queued is due now;
        (session_id, turn_id, queue) to send it, or None."""
        row = self.db.one("wake_next_of_key", turn_id=turn_id)
        return (row["session_id"], row["turn_id"], row["queue"]) if row else None

    def end_claim_of_dead_holder(self, turn_id: str, owner: str | None, epoch: int) -> bool:
        """End a live claim at once if its holder is a process of this machine that died."""
        if not holder_is_dead(owner):
            return False
        ended = self.db.one("end_dead_claim", turn_id=turn_id, owner=owner, epoch=epoch)
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
        rows = self.db.run("live_claims_of_host", pattern=f"%#{token}")
        return [
            row["turn_id"]
            for row in rows
            if self.end_claim_of_dead_holder(row["turn_id"], row["lease_owner"], row["lease_epoch"])
        ]

    def dead_local_receivers(self) -> list[str]:
        """Worker processes of this machine that received a message of an open turn, never
        claimed it, and no longer exist (killed between receiving and claiming)."""
        token = host_token()
        if token is None or not self.end_dead_local_claims:
            return []
        rows = self.db.run("unclaimed_receivers", pattern=f"%#{token}")
        return [row["received_by"] for row in rows if holder_is_dead(row["received_by"])]

    def wake_due(self, batch: int) -> list[str]:
        """Wake the parked turns whose time came (``wake_due``), committed at once: the
        sweep pass then sends them, and a worker that gets the message finds them queued."""
        return [row["turn_id"] for row in self.db.run("wake_due", batch=batch)]

    def sweep_pass(self, key: int) -> AbstractContextManager[LockedPass | None]:
        """A sweeper pass's transaction, holding the fleet-wide lock ``key`` (None: another
        sweeper is at work)."""
        return locked_pass(self.db, key)

    def renew(self, turn_id: str, epoch: int, lease_seconds: float) -> bool:
        """Extend the lease; False when the epoch moved on (the turn was taken over)."""
        row = self.db.one("renew_lease", turn_id=turn_id, epoch=epoch, lease_seconds=lease_seconds)
        return row is not None

    def still_held(self, turn_id: str, epoch: int) -> bool:
        """Does this epoch still own an unexpired lease on the turn?"""
        return bool(self.db.value("still_held", turn_id=turn_id, epoch=epoch))

    def finish(
        self, turn_id: str, epoch: int, reply: str, held: EncodedOutcome | None = None
    ) -> Ended | None:
        """Record the reply and end the turn as done; None if the epoch moved on (or the
        ``held`` step, written with it, is no longer an intent: its claim's writes were lost)."""
        return self._end(turn_id, epoch, TurnStatus.DONE, reply, None, held)

    def fail(self, turn_id: str, epoch: int, error: str) -> Ended | None:
        """End the turn as failed with a reason; None if the epoch moved on."""
        return self._end(turn_id, epoch, TurnStatus.FAILED, None, error, None)

    def _end(
        self,
        turn_id: str,
        epoch: int,
        status: TurnStatus,
        reply: str | None,
        error: str | None,
        held: EncodedOutcome | None,
    ) -> Ended | None:
        row = self.db.one(
            "end_turn",
            turn_id=turn_id,
            epoch=epoch,
            status=str(status),
            reply=None if reply is None else self.db.sealer.text(reply, Where(turn_id, "reply")),
            error=redact(error) if error else None,
            held_step=held.step if held else None,
            held_output=held.output if held else None,
            held_blob=held.blob if held else None,
        )
        if row is None:
            return None
        # flushed: the trigger stayed silent, so the step written with the end is told too
        steps = [f"step {held.step} {turn_id}"] if held is not None else []
        announce(self.db, *steps, f"turn {row['status']} {turn_id}")
        following = (
            (row["session_id"], row["next_turn_id"], row["next_queue"])
            if row["next_turn_id"]
            else None
        )
        return Ended(row["session_id"], row["seq"], following, row["status"])

    def release(self, turn_id: str, epoch: int, delay_seconds: float, error: str | None) -> bool:
        """Give the turn back (queued, journal kept) to be claimed again after a delay."""
        row = self.db.one(
            "release_turn",
            turn_id=turn_id,
            epoch=epoch,
            delay=delay_seconds,
            error=redact(error) if error else None,
        )
        return row is not None


def _refusal(state: Row, queues: list[str] | None) -> Refusal:
    """Why the claim failed, from the turn as it was just read."""
    turn = Turn.from_row(state)
    now: datetime = _aware(state["now"])
    if turn.finished:
        return Refusal("finished", f"turn {turn.turn_id} is already {turn.status}")
    if turn.status == "waiting":
        return Refusal("parked", f"turn {turn.turn_id} is parked: it waits (durable-agent turns)")
    if queues is not None and turn.queue and turn.queue not in queues:
        return Refusal(
            "elsewhere",
            f"turn {turn.turn_id} belongs to queue {turn.queue!r}, which this worker does not "
            f"serve ({', '.join(queues)})",
        )
    expires = turn.lease_expires_at
    if turn.lease_owner is not None and expires is not None and _aware(expires) > now:
        left = (_aware(expires) - now).total_seconds()
        return Refusal(
            "leased",
            f"turn {turn.turn_id} is held by {turn.lease_owner} (epoch {turn.lease_epoch}) "
            f"for {left:.1f}s more",
        )
    if state["waits_for"] is not None:
        return Refusal(
            "waiting",
            f"turn {turn.turn_id} waits for the earlier turn {state['waits_for']} of its session",
        )
    if turn.not_before is not None and _aware(turn.not_before) > now:
        left = (_aware(turn.not_before) - now).total_seconds()
        return Refusal("deferred", f"turn {turn.turn_id} is deferred for {left:.1f}s")
    if state["key_busy"]:
        return Refusal(
            "key_busy",
            f"turn {turn.turn_id} waits for a slot of its concurrency key "
            f"{state['concurrency_key']!r} (or an older turn of the key goes first)",
        )
    # The state moved between the claim and this look.
    return Refusal("leased", f"turn {turn.turn_id} changed hands just now")


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)
