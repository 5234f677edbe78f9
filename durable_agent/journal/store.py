"""Turns, journal rows and blobs: one method per named query.

Every journal write carries the writer's epoch and succeeds only while that epoch is still
the turn's (see ``insert_step`` and ``finish_step`` in ``sql/queries.sql``). A second intent
at the same (turn, step) is rejected by the primary key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from ..errors import LeaseLost, ServiceUnavailable, TurnCancelled, TurnNotFound
from .codec import dumps
from .db import Database
from .listings import Listings
from .notify import announce
from .observed import Observed
from .operator_store import OperatorStore
from .records import EncodedOutcome, Kind, Replay, Step, Turn
from .sealing import Where
from .turn_ids import new_turn_id, submitted_again

log = logging.getLogger(__name__)

WaitForPostgres = Callable[[ServiceUnavailable], None]
"""Blocks until Postgres answers again (given the error that found it unreachable)."""


class JournalStore(Listings, Observed):
    """Turns, journal rows and blobs, through the process's autocommit connection (the
    console's listings of turns, workers and agents come from :class:`Listings`, the
    telemetry's reads from :class:`Observed`)."""

    def __init__(self, db: Database, *, blob_threshold: int = 16 * 1024) -> None:
        self.db = db
        self.blob_threshold = blob_threshold

    # -- turns -----------------------------------------------------------------------------

    def create_turn(
        self,
        session_id: str,
        message: str,
        turn_id: str | None = None,
        *,
        queue: str = "",
        agent: str = "default",
        concurrency_key: str | None = None,
        trace_context: str | None = None,
    ) -> Turn:
        """Record a new turn of ``agent`` at the end of its session (queued, not yet
        enqueued); its messages go to ``queue``; ``concurrency_key``: see ``claim_turn``."""
        turn_id = turn_id or new_turn_id()
        for _ in range(20):
            try:
                row = self.db.one(
                    "create_turn",
                    turn_id=turn_id,
                    session_id=session_id,
                    message=self.db.sealer.text(message, Where(turn_id, "message")),
                    queue=queue,
                    agent=agent,
                    concurrency_key=concurrency_key,
                    trace_context=trace_context,
                )
                assert row is not None
                return Turn.from_row(row)
            except psycopg.errors.UniqueViolation as error:
                existing = self.find_turn(turn_id)
                if existing is not None:  # the same turn id submitted again: idempotent
                    return submitted_again(existing, session_id, message, agent, error)
                # another turn of this session took the same position: try the next one
        raise RuntimeError(f"could not place a new turn in session {session_id!r}")

    def now(self) -> datetime:
        """Postgres's clock (``durable_agent_now()``), by which every recorded time is taken."""
        now: datetime = self.db.value("database_now")
        return now

    def find_turn(self, turn_id: str, *, marked: bool = False) -> Turn | None:
        """The turn, or None. ``marked``: a message or reply that does not open is None
        and listed in ``Turn.unreadable`` instead of raising (for what needs only the
        clear columns: cancel, the claim's bookkeeping, a console page)."""
        if marked:
            row = self.db.one_marked("find_turn", turn_id=turn_id)
        else:
            row = self.db.one("find_turn", turn_id=turn_id)
        return Turn.from_row(row) if row else None

    def get_turn(self, turn_id: str) -> Turn:
        turn = self.find_turn(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return turn

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        """One session's turns in order, or the newest turns first; a message or reply
        that does not open is marked (``Turn.unreadable``), not a failed listing."""
        if session_id is None:
            rows = self.db.run_marked("list_turns", limit=limit)
        else:
            rows = self.db.run_marked("list_session_turns", session_id=session_id, limit=limit)
        return [Turn.from_row(row) for row in rows]

    def session_history(self, session_id: str, before_seq: int) -> list[tuple[str, str]]:
        """(user message, reply) of the session's earlier finished turns, in order."""
        rows = self.db.run("session_history", session_id=session_id, seq=before_seq)
        return [(row["message"], row["reply"] or "") for row in rows]

    def record_turn_agent(
        self,
        turn_id: str,
        epoch: int,
        digest: str,
        spec: dict[str, Any],
        changes: str | None,
    ) -> None:
        """The agent this claim runs the turn with (digest and spec kept from the first),
        and what differs from the recorded one (None: nothing)."""
        self.db.run(
            "record_turn_agent",
            turn_id=turn_id,
            epoch=epoch,
            digest=digest,
            spec=dumps(spec),
            changes=changes,
        )

    def mark_sent(self, turn_ids: list[str], message_ids: list[str]) -> None:
        """Before publishing: these messages are the turns' latest, sent now."""
        self.db.run("mark_sent", turn_ids=turn_ids, message_ids=message_ids)

    def unmark_sent(self, turn_id: str, message_id: str) -> None:
        """The publish of this message failed."""
        self.db.run("unmark_sent", turn_id=turn_id, message_id=message_id)

    def defer_unclaimed(self, turn_id: str, delay_seconds: float) -> bool:
        """Keep a turn no live claim holds from being sent for ``delay_seconds`` (the sweeper
        sends it then); False if a worker holds it or it ended."""
        return bool(self.db.run("defer_unclaimed", turn_id=turn_id, delay=delay_seconds))

    def record_receipt(self, turn_id: str, message_id: str, receiver: str) -> None:
        """A worker received this message of the turn (committed without a WAL wait)."""
        self.db.run("record_receipt", turn_id=turn_id, message_id=message_id, receiver=receiver)

    # -- journal ---------------------------------------------------------------------------

    def for_claim(
        self,
        turn_id: str,
        epoch: int,
        *,
        empty: bool = False,
        wait_for_postgres: WaitForPostgres | None = None,
    ) -> ClaimedJournal:
        """The turn's journal as the claim at ``epoch`` writes it (``empty``: known to have
        no steps yet, so none are read; ``wait_for_postgres``: see ClaimedJournal)."""
        return ClaimedJournal(
            self, turn_id, epoch, [] if empty else None, wait_for_postgres=wait_for_postgres
        )

    def load_journal(self, turn_id: str, *, marked: bool = False) -> list[Step]:
        """Every journal row of the turn, in step order: one query, blobs joined in.
        ``marked`` (for a page that shows it): a payload that does not open is None and
        listed in ``Step.unreadable`` instead of raising."""
        if marked:
            rows = self.db.run_marked("load_journal", turn_id=turn_id)
            return [Step.from_row(row) for row in rows]
        return self.db.records("load_journal", Step, turn_id=turn_id)

    def load_journal_from(self, turn_id: str, first: int) -> list[Step]:
        """The journal rows of the turn from step ``first`` on, in step order."""
        rows = self.db.run("load_journal_from", turn_id=turn_id, first=first)
        return [Step.from_row(row) for row in rows]

    def insert_intent(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        *,
        before: EncodedOutcome | None = None,
    ) -> None:
        """Commit the intent of a call before it runs (``before``: the outcome of the step
        before it, written in the same statement)."""
        self._insert_step(turn_id, epoch, step, kind, name, input, replay, "intent", None, before)

    def insert_done(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        output: Any,
        *,
        before: EncodedOutcome | None = None,
    ) -> None:
        """Record a step that ran nothing (a refused call) as done in one write."""
        self._insert_step(turn_id, epoch, step, kind, name, input, replay, "done", output, before)

    def encode_outcome(self, turn_id: str, step: int, output: Any) -> EncodedOutcome:
        """The outcome as it will be written (sealed when a key is configured; a large one
        is put into blobs now)."""
        stored, blob = self._store_payload(turn_id, step, output)
        return EncodedOutcome(step, stored, blob)

    def record_outcome(
        self, turn_id: str, epoch: int, step: int, output: Any, *, durable: bool = True
    ) -> None:
        """Mark an intent done with its outcome (``durable``: wait for the WAL flush)."""
        outcome = self.encode_outcome(turn_id, step, output)
        self.write_outcome(turn_id, epoch, outcome, durable=durable)

    def write_outcome(
        self,
        turn_id: str,
        epoch: int,
        outcome: EncodedOutcome,
        *,
        durable: bool,
    ) -> None:
        """Mark an intent done. A flushed outcome is announced after its commit (the trigger
        announces the others)."""
        row = self.db.one(
            "finish_step",
            turn_id=turn_id,
            epoch=epoch,
            step=outcome.step,
            output=outcome.output,
            blob=outcome.blob,
            durable=durable,
        )
        if row is None:
            raise self.lost(turn_id, epoch, f"outcome of step {outcome.step}")
        if durable:  # the trigger announces only unflushed commits
            announce(self.db, f"step {outcome.step} {turn_id}")

    def note_failed_call(self, turn_id: str, epoch: int) -> None:
        """The model call in flight failed at the API (not billed; see the spend ledger)."""
        self.db.run("note_failed_call", turn_id=turn_id, epoch=epoch)

    # -- the spend ledger --------------------------------------------------------------------

    def spend_rows(
        self, by: str, turn_ids: list[str] | None = None, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """The finished model calls summed per ``by`` ('turn' or 'day') and model."""
        return self.db.run("spend", by=by, turn_ids=turn_ids, since=since)

    def _insert_step(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        status: str,
        output: Any,
        before: EncodedOutcome | None,
    ) -> None:
        stored, blob = (
            self._store_payload(turn_id, step, output) if status == "done" else (None, None)
        )
        # the intent of a never tool is on disk before the call runs (see queries.sql)
        durable = status == "intent" and replay == "never"
        params: dict[str, Any] = dict(
            turn_id=turn_id,
            epoch=epoch,
            step=step,
            kind=kind,
            name=name,
            input=self.db.sealer.json(input, Where(turn_id, "input", step)),
            replay=replay,
            status=status,
            output=stored,
            blob=blob,
            durable=durable,
        )
        what = f"{status} of step {step}"
        if before is not None:
            if before.step != step - 1:
                raise ValueError(f"the outcome of step {before.step} cannot go with step {step}")
            params.update(before_output=before.output, before_blob=before.blob)
            what = f"outcome of step {before.step} and {what}"
        try:
            row = self.db.one(
                "insert_step" if before is None else "finish_and_insert_step", **params
            )
        except psycopg.errors.UniqueViolation as error:
            raise LeaseLost(
                f"turn {turn_id}: step {step} is already recorded by another writer "
                f"(primary key (turn_id, step) rejected this {status})"
            ) from error
        if row is None:
            raise self.lost(turn_id, epoch, what)
        # the trigger announces steps done by commits that do not wait for the flush; the
        # step a flushed one carries (a never tool's intent after a model step) is told here
        if durable and before is not None:
            announce(self.db, f"step {before.step} {turn_id}")

    def _store_payload(self, turn_id: str, step: int, output: Any) -> tuple[str | None, str | None]:
        """JSON for the row, or (None, blob id) after moving a large payload into blobs;
        sealed when a key is configured."""
        if output is None:
            return "null", None
        encoded = dumps(output)
        sealer = self.db.sealer
        if len(encoded) <= self.blob_threshold:
            return sealer.json(output, Where(turn_id, "output", step), encoded), None
        sha = sealer.blob_id(encoded)
        data = sealer.json(output, Where(turn_id, "data", blob=sha), encoded)
        self.db.run("put_blob", sha256=sha, data=data, size=len(encoded))
        return None, sha

    def lost(self, turn_id: str, epoch: int, what: str) -> LeaseLost | TurnCancelled:
        """Why a write of this claim was refused: the turn is gone, cancelled, taken over,
        or (still ours) the journal lost its last writes in a Postgres crash."""
        turn = self.find_turn(turn_id, marked=True)
        if turn is None:
            return LeaseLost(f"turn {turn_id} no longer exists; {what} not written")
        if turn.lease_epoch == epoch and turn.status == "running":
            cancel = OperatorStore(self.db).find_cancellation(turn_id)
            if cancel is not None:  # the step boundary where a cancel stops the turn
                return TurnCancelled(
                    f"turn {turn_id} cancelled by {cancel.requested_by}"
                    + (f": {cancel.reason}" if cancel.reason else "")
                    + f"; {what} not written"
                )
            return LeaseLost(
                f"turn {turn_id}: {what} rejected: the journal lost its last writes "
                "(Postgres restarted after a crash); the turn starts again from what survived"
            )
        return LeaseLost(
            f"turn {turn_id}: {what} rejected: this writer holds epoch {epoch}, the turn is "
            f"at epoch {turn.lease_epoch} ({turn.status})"
        )


class ClaimedJournal:
    """The Postgres journal of one turn as one claim writes it (see ``TurnJournal``).

    The outcome of a ``never`` call that ran is known to this worker alone until it is
    written: with ``wait_for_postgres``, a write that cannot reach Postgres keeps the outcome,
    waits until Postgres answers and writes it then, if this claim's epoch is still the
    turn's (the fence decides; otherwise LeaseLost, and the turn's new holder reads the call
    as interrupted). Without it, the outage ends the delivery and the call is uncertain.
    """

    def __init__(
        self,
        store: JournalStore,
        turn_id: str,
        epoch: int,
        steps: list[Step] | None = None,
        *,
        wait_for_postgres: WaitForPostgres | None = None,
    ) -> None:
        self.store = store
        self.turn_id = turn_id
        self.epoch = epoch
        self.wait_for_postgres = wait_for_postgres
        self._steps = steps
        self._never_steps: set[int] = set()  # intents of never tools this claim wrote
        self._held: EncodedOutcome | None = None  # an outcome written with the next write

    def steps(self) -> list[Step]:
        if self._steps is None:
            self._steps = self.store.load_journal(self.turn_id)
        return self._steps

    def insert_intent(
        self, step: int, kind: Kind, name: str, input: dict[str, Any], replay: Replay | None
    ) -> None:
        self.store.insert_intent(
            self.turn_id,
            self.epoch,
            step,
            kind,
            name,
            input,
            replay,
            before=self._held_for(step),
        )
        if replay == "never":
            self._never_steps.add(step)

    def insert_done(
        self,
        step: int,
        kind: Kind,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        output: Any,
    ) -> None:
        self.store.insert_done(
            self.turn_id,
            self.epoch,
            step,
            kind,
            name,
            input,
            replay,
            output,
            before=self._held_for(step),
        )

    def record_outcome(self, step: int, output: Any) -> None:
        # The outcome of a never call is committed at once, without waiting for the WAL
        # flush: the turn's next flushed write (a never intent, the end) takes it to disk.
        # A worker crash loses nothing of it (the commit happened); a Postgres crash can
        # lose it with the last moments of the WAL, and the flushed intent then reads as
        # "may or may not have happened": never a second effect. Any other outcome is held
        # back and written with the next step (or by flush): a worker killed in between
        # runs that call again, as it would if the call itself had been cut short.
        self._write_held()
        if step in self._never_steps:
            self._write_kept(step, output)  # announced by the trigger (an unflushed commit)
        else:
            self._held = self.store.encode_outcome(self.turn_id, step, output)

    def _write_kept(self, step: int, output: Any) -> None:
        """Write a never call's outcome, through a Postgres outage if ``wait_for_postgres``."""
        retried = False
        while True:
            try:
                outcome = self.store.encode_outcome(self.turn_id, step, output)
                self.store.write_outcome(self.turn_id, self.epoch, outcome, durable=False)
                return
            except ServiceUnavailable as error:
                if self.wait_for_postgres is None:
                    raise
                log.warning(
                    "turn %s: keeping the outcome of step %d until Postgres is back (%s)",
                    self.turn_id,
                    step,
                    error,
                )
                self.wait_for_postgres(error)
                retried = True
            except LeaseLost:
                if retried and self._written_by_this_claim(step):
                    return  # the write before the connection broke did commit
                raise

    def _written_by_this_claim(self, step: int) -> bool:
        done = self.store.load_journal_from(self.turn_id, step)
        return (
            bool(done)
            and done[0].step == step
            and done[0].status == "done"
            and (done[0].epoch == self.epoch)
        )

    def take_held(self) -> EncodedOutcome | None:
        """The held-back outcome, for the caller to write with the turn's end (which
        then owns it: it is no longer this journal's to flush)."""
        held, self._held = self._held, None
        return held

    def flush(self) -> None:
        self._write_held()

    def _write_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.store.write_outcome(self.turn_id, self.epoch, held, durable=False)

    def _held_for(self, step: int) -> EncodedOutcome | None:
        """The held-back outcome, to go with the write of ``step`` when it is the step before."""
        if self._held is not None and self._held.step != step - 1:
            self._write_held()
        return self.take_held()
