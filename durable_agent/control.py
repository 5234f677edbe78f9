"""Cancel a turn, and prune finished turns.

**Cancel.** ``cancel_turn`` records who asked and why (``cancellations``). A turn that no
worker holds (queued, parked for an approval, or whose claim ran out) ends ``cancelled`` at
once. A turn a worker is running stops at its next step boundary: the journal refuses every
new step of a cancelled turn (``insert_step``), the worker sees why and ends the turn as
cancelled, fenced by its epoch. A call already running, above all a ``never`` tool, runs to
its end and its outcome is recorded: a cancel never cuts a call in half. The session goes
on: its next turn is sent.

**Prune.** ``prune`` deletes finished turns older than a cutoff, with their journal,
approvals, cancellations and resolutions, then the blobs nothing refers to any more, in
batches of short transactions that skip rows someone else holds. It keeps a turn with an
uncertain effect not yet resolved, and every turn of a session that still has an open turn
(whose conversation is built from them).
"""

from __future__ import annotations

import getpass
import logging
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import DurableAgentError, InvalidArgument, TurnCancelled
from .inputs import check_id
from .journal.control import Cancellation, ControlStore, PruneCount
from .journal.records import Ended, Turn

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 2000
BLOB_GRACE_SECONDS = 3600.0  # a blob younger than this may be about to be referred to
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def operator() -> str:
    """Who is acting, when the caller does not say: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def check_note(name: str, value: Any, *, required: bool = False) -> str | None:
    """A free-text note (a reason, a resolution note), or InvalidArgument."""
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{name} must be text, got {type(value).__name__}")
    if value is None or not value.strip():
        if required:
            raise InvalidArgument(f"{name} is required")
        return None
    if "\x00" in value or len(value) > MAX_NOTE_CHARS:
        raise InvalidArgument(f"{name} must be at most {MAX_NOTE_CHARS} characters with no NUL")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{name} is not valid text (a lone surrogate)") from None
    return value


def check_by(value: Any) -> str:
    """Who is acting (``None``: this user at this host)."""
    if value is None:
        return operator()
    return check_id("by", value)


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What ``cancel_turn`` did: the turn as it is now, whether this call asked (a second
    request keeps the first one's who and why), and the request on record."""

    turn: Turn
    requested: bool
    cancellation: Cancellation | None

    @property
    def cancelled(self) -> bool:
        return self.turn.status == "cancelled"

    def describe(self) -> str:
        turn = self.turn
        if self.cancelled:
            return f"turn {turn.turn_id} cancelled ({turn.error})"
        if self.cancellation is None:
            return f"turn {turn.turn_id} is already {turn.status}: nothing to cancel"
        if turn.finished:
            return (
                f"turn {turn.turn_id} ended {turn.status} before it reached a step boundary; "
                "the cancel came too late"
            )
        return (
            f"turn {turn.turn_id} is held by {turn.lease_owner}: it stops at its next step "
            f"boundary (cancel asked by {self.cancellation.requested_by})"
        )

    def as_json(self) -> dict[str, Any]:
        c = self.cancellation
        return {
            "turn": self.turn.as_json(),
            "cancelled": self.cancelled,
            "requested": self.requested,
            "requested_by": c.requested_by if c else None,
            "reason": c.reason if c else None,
            "requested_at": c.requested_at.isoformat() if c else None,
        }


def cancel(
    runtime: Runtime, turn_id: str, reason: str | None = None, *, by: str | None = None
) -> CancelResult:
    """Ask a turn to stop; see the module docstring."""
    check_id("turn_id", turn_id)
    reason = check_note("reason", reason)
    who = check_by(by)
    runtime.get_turn(turn_id)  # TurnNotFound for an unknown id
    store = ControlStore(runtime.database)
    requested = store.request_cancel(turn_id, who, reason)
    ended = store.end_unheld_cancelled(turn_id)
    if ended is not None:
        log.info("turn %s cancelled by %s", turn_id, who)
        send_next(runtime, ended)
    return CancelResult(runtime.get_turn(turn_id), requested, store.find_cancellation(turn_id))


def stop_if_cancelled(runtime: Runtime, turn_id: str) -> None:
    """Raise TurnCancelled if someone asked the turn to stop: a claim that resumes a turn
    checks first, so that it does not run an interrupted call again only to stop after it."""
    cancel = ControlStore(runtime.database).find_cancellation(turn_id)
    if cancel is not None:
        raise TurnCancelled(
            f"turn {turn_id} cancelled by {cancel.requested_by}"
            + (f": {cancel.reason}" if cancel.reason else "")
        )


def end_cancelled(runtime: Runtime, turn_id: str, epoch: int) -> Ended | None:
    """The worker holding a cancelled turn ends it (None if its epoch moved on)."""
    ended = ControlStore(runtime.database).end_claimed_cancelled(turn_id, epoch)
    if ended is not None:
        log.warning("turn %s cancelled at a step boundary", turn_id)
    return ended


def send_next(runtime: Runtime, ended: Ended) -> None:
    """Send the next turn of an ended turn's session (the sweeper does if this fails)."""
    if ended.next_turn is None:
        return
    try:
        runtime.enqueue(*ended.next_turn)
    except DurableAgentError as error:
        log.warning("could not enqueue %s (the sweeper will): %s", ended.next_turn, error)


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` in seconds, or InvalidArgument."""
    match = _AGE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(
            f"not an age: {text!r} (a number and a unit: s, m, h, d or w, e.g. 30d)"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not 0 < seconds <= 100 * 365 * 86_400:
        raise InvalidArgument(f"age {text!r} must be more than 0 and at most 100 years")
    return seconds


def prune(
    runtime: Runtime,
    older_than: float | str,
    *,
    dry_run: bool = False,
    batch: int = 500,
    blob_grace_seconds: float = BLOB_GRACE_SECONDS,
) -> PruneCount:
    """Delete finished turns that ended more than ``older_than`` ago (seconds, or an age such
    as ``"30d"``; see the module docstring); with ``dry_run``, only count them."""
    older_than_seconds = parse_age(older_than) if isinstance(older_than, str) else older_than
    if isinstance(older_than_seconds, bool) or not isinstance(older_than_seconds, int | float):
        raise InvalidArgument("older_than_seconds must be a number of seconds")
    if not 0 < older_than_seconds < float("inf"):
        raise InvalidArgument("older_than_seconds must be more than 0")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise InvalidArgument("batch must be a whole number from 1 to 10000")
    store = ControlStore(runtime.database)
    preview = store.prune_preview(older_than_seconds)
    if dry_run:
        return preview
    turns = steps = blobs = 0
    while True:
        done = store.prune_turns(older_than_seconds, batch)
        turns, steps = turns + done.turns, steps + done.steps
        if done.turns < batch:
            break
    while True:
        deleted = store.prune_blobs(blob_grace_seconds, batch)
        blobs += deleted
        if deleted < batch:
            break
    log.info("pruned %d turns, %d steps, %d blobs", turns, steps, blobs)
    return PruneCount(turns=turns, steps=steps, kept=preview.kept, blobs=blobs)
