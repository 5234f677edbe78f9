"""Rows that do not open, on real prefork workers: a turn whose steps are sealed with a key
a worker lacks is handed back (never failed) and finished by a worker that holds the key;
a turn whose message was altered ends failed in one log line instead of being sent, claimed
and retried forever."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import psycopg
import pytest

from durable_agent import wait_for_turn
from durable_agent.delivery.turn_worker import MISSING_KEY_MAX_SECONDS
from durable_agent.journal import SEALED_KEY, new_key
from durable_agent.runtime import Runtime
from durable_agent.step.faults import Faults
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import DatabaseClock, Spawn, Stack

K1 = new_key()
TURNS = 5


class Crash(BaseException):
    """A worker's death acted out in this process (nothing catches a BaseException)."""


def _crash(what: str) -> NoReturn:
    raise Crash(what)


def _seal_steps_then_crash(stack: Stack, turn_ids: list[str]) -> None:
    """Run each turn on a worker holding k1 until it dies before step 2's call: the message
    stays clear (recorded without a key), steps 0 to 2 are sealed under k1, and the claim
    runs out a second later."""
    runtime = Runtime(stack.settings.model_copy(update={"keys": f"k1:{K1}", "lease_seconds": 1.0}))
    try:
        worker = runtime.build_turn_worker(faults=Faults((2, "before_run"), exit=_crash))
        for turn_id in turn_ids:
            with pytest.raises(Crash):
                worker.handle(turn_id)
    finally:
        runtime.close()


@pytest.mark.long
def test_a_worker_without_the_key_hands_turns_back_and_one_with_it_finishes_them(
    stack: Stack, spawn: Spawn, clock: DatabaseClock, pg: psycopg.Connection
) -> None:
    """Five turns with a clear message and sealed steps: a prefork worker with no key hands
    each back (queued, its error naming key k1, no crash counted for it), never fails one;
    a prefork worker with k1 then finishes all five, each email sent once."""
    turn_ids = [stack.store.create_turn(f"s{i}", stack.message).turn_id for i in range(TURNS)]
    _seal_steps_then_crash(stack, turn_ids)
    sealed = pg.execute(
        "SELECT count(*) FILTER (WHERE input ? %s), count(*) FROM journal", (SEALED_KEY,)
    ).fetchone()
    assert sealed == (3 * TURNS, 3 * TURNS)

    keyless = spawn(name="keyless", pool="prefork", concurrency=2)

    def handed_back() -> bool:
        turns = [stack.store.get_turn(t) for t in turn_ids]
        assert not [t for t in turns if t.status == "failed"], [t.error for t in turns]
        return all(
            t.status == "queued" and "'k1'" in (t.error or "") and t.not_before is not None
            for t in turns
        )

    try:
        wait_until(handed_back, 90, "every turn handed back by the worker without the key")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{stack.logs()}") from error
    turns = [stack.store.get_turn(t) for t in turn_ids]
    assert all("waits for a worker that holds its key" in (t.error or "") for t in turns)
    assert all(t.crashes == 1 for t in turns)  # the crash above; handing back counts none
    assert stack.inbox.count == 0
    log = keyless.log_text()
    assert "Traceback" not in log and log.count("handed back: waits for a worker") >= TURNS
    keyless.stop()

    spawn(name="keyed", pool="prefork", concurrency=2, DURABLE_AGENT_KEYS=f"k1:{K1}")
    clock.advance(MISSING_KEY_MAX_SECONDS)  # the hand-backs' wait is over: the sweeper sends
    keyed = stack.settings.model_copy(update={"keys": f"k1:{K1}"})
    for turn_id in turn_ids:
        try:
            turn = wait_for_turn(turn_id, 120, settings=keyed)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from error
        assert (turn.status, turn.reply) == ("done", stack.clean_reply), stack.logs()
    assert stack.inbox.count == TURNS
    assert sorted(m.subject for m in stack.inbox.messages) == [stack.subject] * TURNS


def test_a_tampered_message_ends_the_turn_failed_in_one_log_line(
    stack: Stack, spawn: Spawn, pg: psycopg.Connection
) -> None:
    """A sealed message copied from another turn's row: the worker fails the turn naming
    the row and field, logs it once without a traceback, and the sweeper no longer sends
    it; the other turn runs as usual."""
    runtime = Runtime(stack.settings.model_copy(update={"keys": f"k1:{K1}"}))
    try:
        good = runtime.journal.create_turn("good", stack.message)
        moved = runtime.journal.create_turn("moved", "another message")
        pg.execute(
            "UPDATE turns SET message = (SELECT message FROM turns WHERE turn_id = %s) "
            "WHERE turn_id = %s",
            (good.turn_id, moved.turn_id),
        )
        worker = spawn(pool="prefork", concurrency=2, DURABLE_AGENT_KEYS=f"k1:{K1}")
        for turn in (moved, good):
            runtime.enqueue(turn.session_id, turn.turn_id, turn.queue)

        failed = wait_until(
            lambda: (t := runtime.journal.find_turn(moved.turn_id, marked=True)).finished and t,
            60,
            "the tampered turn to end",
        )
        assert failed.status == "failed", (failed.status, failed.error, worker.log_tail())
        assert f"turn {moved.turn_id} message" in (failed.error or "")
        assert "does not open" in (failed.error or "") and failed.crashes == 0
        done = wait_for_turn(good.turn_id, 60, settings=runtime.settings)
        assert done.reply == stack.clean_reply
        log = worker.log_text()
        assert "Traceback" not in log, log
        errors = [line for line in log.splitlines() if "ERROR" in line and moved.turn_id in line]
        assert len(errors) == 1 and "failed: a stored value does not open" in errors[0], errors
    finally:
        runtime.close()
