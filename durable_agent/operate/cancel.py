"""Cancel a turn, and who is acting (for every operator's command).

**Cancel.** ``cancel_turn`` records who asked and why (``cancellations``). A turn that no
worker holds (queued, parked for an approval, or whose claim ran out) ends ``cancelled`` at
once. A turn a worker is running stops at its next step boundary: the journal refuses every
new step of a cancelled turn (``insert_step``), the worker sees why and ends the turn as
cancelled, fenced by its epoch. A call already running, above all a ``never`` tool, runs to
its end and its outcome is recorded: a cancel never cuts a call in half. The end of the
turn is a step boundary too: a cancel recorded before the end commits ends the turn
``cancelled`` (its reply stays in the journal); one that comes after says it came too late.
Cancelling a turn already cancelled changes nothing and succeeds (it says who cancelled
it). The session goes on: its next turn is sent. A parked turn (waiting for a time, an
event, a child) is not held by any worker: it ends at once. The open child turns of a
cancelled turn (``ctx.run_agent``) are cancelled with it.

Cancel reads only a turn's clear columns (ids, status, holder): a turn whose message or
journal does not open (sealed with a key this process lacks, or tampered) is cancelled like
any other, and its payloads show as marked (``Turn.unreadable``), never opened.
"""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import DurableAgentError, InvalidArgument, TurnCancelled, TurnNotFound
from ..inputs import check_id
from ..journal import Cancellation, Ended, OperatorStore, Turn

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 2000

GetTurn = Callable[[str], Turn]
"""The turn as recorded now, with its spend ledger; TurnNotFound for an unknown id."""
Enqueue = Callable[[str, str, str], None]
"""Send ``(session_id, turn_id, queue)`` to a worker (``Runtime.enqueue``)."""


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
        if self.cancelled and not self.requested:
            return f"turn {turn.turn_id} was already {turn.error}; nothing changed"
        if self.cancelled:
            return f"turn {turn.turn_id} cancelled ({turn.error})"
        if self.cancellation is None:
            return (
                f"turn {turn.turn_id} already ended {turn.status}: the cancel came too late, "
                "nothing changed"
            )
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
    store: OperatorStore,
    enqueue: Enqueue,
    turn_id: str,
    reason: str | None = None,
    *,
    by: str | None = None,
    store_end: Callable[[str], None] = lambda turn_id: None,
) -> CancelResult:
    """Ask a turn to stop; see the module docstring. ``store_end``: keep the end of a turn
    this ended for ``agent_turn.delay(...).get()`` (``Runtime.store_end``)."""
    check_id("turn_id", turn_id)
    reason = check_note("reason", reason)
    who = check_by(by)
    _turn(store, turn_id)  # TurnNotFound for an unknown id
    requested = store.request_cancel(turn_id, who, reason)
    ended = store.end_unheld_cancelled(turn_id)
    if ended is not None:
        log.info("turn %s cancelled by %s", turn_id, who)
        store.announce(f"turn cancelled {turn_id}")  # wakes wait and watch
        send_next(enqueue, ended)
        store_end(turn_id)  # for agent_turn.delay(...).get()
    for child in store.open_children(turn_id):  # its child agents' turns stop too
        cancel(
            store,
            enqueue,
            child,
            f"its parent turn {turn_id} was cancelled",
            by=who,
            store_end=store_end,
        )
    return CancelResult(_turn(store, turn_id), requested, store.find_cancellation(turn_id))


def _turn(store: OperatorStore, turn_id: str) -> Turn:
    """The turn's clear columns; its payloads are not opened (see the module docstring)."""
    turn = store.find_turn(turn_id)
    if turn is None:
        raise TurnNotFound(turn_id)
    return turn


def stop_if_cancelled(store: OperatorStore, turn_id: str) -> None:
    """Raise TurnCancelled if someone asked the turn to stop: a claim that resumes a turn
    checks first, so that it does not run an interrupted call again only to stop after it."""
    cancel = store.find_cancellation(turn_id)
    if cancel is not None:
        raise TurnCancelled(
            f"turn {turn_id} cancelled by {cancel.requested_by}"
            + (f": {cancel.reason}" if cancel.reason else "")
        )


def end_cancelled(store: OperatorStore, turn_id: str, epoch: int) -> Ended | None:
    """The worker holding a cancelled turn ends it (None if its epoch moved on)."""
    ended = store.end_claimed_cancelled(turn_id, epoch)
    if ended is not None:
        log.warning("turn %s cancelled at a step boundary", turn_id)
        store.announce(f"turn cancelled {turn_id}")  # wakes wait and watch
    return ended


def send_next(enqueue: Enqueue, ended: Ended) -> None:
    """Send the next turn of an ended turn's session (the sweeper does if this fails)."""
    if ended.next_turn is None:
        return
    try:
        enqueue(*ended.next_turn)
    except DurableAgentError as error:
        log.warning("could not enqueue %s (the sweeper will): %s", ended.next_turn, error)
