"""Rows that do not open, on a real Postgres with a real turn worker: a tampered message or
step ends its turn failed, naming the row and field, in one log line; a row sealed with a
key the worker lacks hands the turn back without counting a crash; cancel, `durable-agent
turns` (table and --json) and the listings work without opening a payload and mark the rows
that do not open."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from inprocess import CrashAt, SimulatedCrash

from durable_agent.app import operator as ops
from durable_agent.delivery.turn_worker import TurnWorker, missing_key_delay
from durable_agent.journal import new_key
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import SmtpInbox

if TYPE_CHECKING:
    from conftest import DatabaseClock

MESSAGE = "Please email the note launch to ada@example.com"
REPLY = "Done: the note 'launch' was sent to ada@example.com."
K1, K2 = new_key(), new_key()
SEALED_K1 = "[sealed: key k1 unavailable]"
TAMPERED = "[does not open: tampered]"


def _worker(runtime: Runtime, crash: Any = None) -> TurnWorker:
    return runtime.build_turn_worker(faults=CrashAt(crash))


def _move_message(pg: psycopg.Connection, source: str, target: str) -> None:
    """Copy one turn's sealed message into another's row (it is bound to its own row)."""
    pg.execute(
        "UPDATE turns SET message = (SELECT message FROM turns WHERE turn_id = %s) "
        "WHERE turn_id = %s",
        (source, target),
    )


def _crash_at(runtime: Runtime, turn_id: str, step: int) -> None:
    """Run the turn until its worker dies before step ``step``'s call (acted out in a
    thread: the claim is left to run out)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            _worker(runtime, (step, "before_run")).handle(turn_id)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash), caught


def _worker_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "durable_agent.delivery.turn_worker"]


def test_a_tampered_message_ends_the_turn_failed_once(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the claim raised PayloadTampered on every delivery (a traceback each), the
    turn stayed running and the sweeper sent it again every lease. Now the first delivery
    ends it failed, naming the turn and the field, in one line without a traceback."""
    runtime = runtimes(f"k1:{K1}")
    source = runtime.journal.create_turn("a", "the first message")
    moved = runtime.journal.create_turn("b", "the second message")
    _move_message(pg, source.turn_id, moved.turn_id)
    caplog.set_level(logging.INFO)

    delivery = _worker(runtime).handle(moved.turn_id)

    assert delivery.outcome == "failed"
    turn = runtime.journal.find_turn(moved.turn_id, marked=True)
    assert turn is not None and turn.status == "failed" and turn.crashes == 0
    assert f"turn {moved.turn_id} message" in (turn.error or "")
    assert "'k1' does not open" in (turn.error or "")
    records = _worker_records(caplog)
    assert [r.levelname for r in records] == ["ERROR"], [r.getMessage() for r in records]
    assert records[0].exc_info is None
    again = _worker(runtime).handle(moved.turn_id)
    assert again.outcome == "refused" and "already failed" in again.detail
    assert runtime.sweeper().sweep_once() == []  # an ended turn is not sent again


def test_a_tampered_step_ends_the_turn_failed_naming_the_step(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    clock: DatabaseClock,
    inbox: SmtpInbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A step altered in the table: the resuming worker fails the turn with the turn id,
    step and field, one line, no traceback (before: "unexpected error" with a traceback)."""
    runtime = runtimes(f"k1:{K1}", lease_seconds=0.5)
    turn = runtime.journal.create_turn("s", MESSAGE)
    _crash_at(runtime, turn.turn_id, 2)
    pg.execute(  # four base64 characters of step 1's output changed
        "UPDATE journal SET output = jsonb_set(output, '{$}', to_jsonb("
        "overlay(output->>'$' placing 'AAAA' from length(output->>'$') - 8 for 4)))"
        "WHERE turn_id = %s AND step = 1",
        (turn.turn_id,),
    )
    clock.advance(5.0)  # the dead worker's claim runs out
    caplog.set_level(logging.INFO)

    delivery = _worker(runtime).handle(turn.turn_id)

    assert delivery.outcome == "failed", delivery
    ended = runtime.journal.get_turn(turn.turn_id)
    assert ended.status == "failed"
    assert f"turn {turn.turn_id} step 1 output" in (ended.error or "")
    assert "does not open" in (ended.error or "") and "unexpected" not in (ended.error or "")
    errors = [r for r in _worker_records(caplog) if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in errors]
    assert inbox.count == 0


def test_a_missing_key_hands_the_turn_back_without_a_crash(
    runtimes: Callable[..., Runtime],
    clock: DatabaseClock,
    inbox: SmtpInbox,
) -> None:
    """A turn with a clear message and steps sealed under k1, on a worker holding only k2
    (a rotation's new key) and on one with no key: handed back, not failed, no crash
    counted, waiting visibly with the key named; then finished by a worker with k1."""
    clear = runtimes("")
    turn = clear.journal.create_turn("s", MESSAGE)
    _crash_at(runtimes(f"k1:{K1}", lease_seconds=0.5), turn.turn_id, 2)
    clock.advance(5.0)

    for keys, holds in ((f"k2:{K2}", "holds k2"), ("", "no keys are configured")):
        delivery = _worker(runtimes(keys)).handle(turn.turn_id)
        assert delivery.outcome == "deferred", delivery
        waiting = clear.journal.get_turn(turn.turn_id)
        assert waiting.status == "queued" and waiting.finished_at is None
        assert "waits for a worker that holds its key" in (waiting.error or "")
        assert "sealed with key 'k1'" in (waiting.error or "") and holds in (waiting.error or "")
        assert waiting.crashes == 1  # taking over the dead worker's claim; hand-backs: none
        assert waiting.not_before is not None
        wait = (waiting.not_before - clear.journal.now()).total_seconds()
        assert 0 < wait <= missing_key_delay(waiting.attempts)
        clock.advance(wait + 1)

    delivery = _worker(runtimes(f"k2:{K2},k1:{K1}")).handle(turn.turn_id)
    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert inbox.count == 1


def test_the_wait_for_a_missing_key_doubles_up_to_five_minutes() -> None:
    assert [missing_key_delay(n) for n in (1, 2, 3, 4, 5, 6, 50)] == [
        15.0,
        30.0,
        60.0,
        120.0,
        240.0,
        300.0,
        300.0,
    ]


def test_cancel_opens_no_payload(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A tampered turn and one sealed with a key the operator lacks are cancelled from
    Python and from the command line (before: both raised opening the message)."""
    from durable_agent.cli import main
    from durable_agent.journal import set_interface

    keyed = runtimes(f"k1:{K1}", result_backend=settings.broker_url)
    source = keyed.journal.create_turn("a", "first")
    moved = keyed.journal.create_turn("b", "second")
    sealed = keyed.journal.create_turn("c", "third")
    _move_message(pg, source.turn_id, moved.turn_id)

    result = ops.cancel_turn(moved.turn_id, "does not open", by="ops", settings=keyed.settings)
    assert result.cancelled and result.turn.unreadable_field("message") is not None
    assert result.as_json()["turn"]["unreadable"]["message"]["reason"] == "tampered"
    backend = keyed.celery.backend  # the end is stored for agent_turn.delay(...).get()
    try:
        assert backend.get_task_meta(moved.turn_id)["status"] == "FAILURE"
    finally:
        backend.forget(moved.turn_id)

    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DURABLE_AGENT_KEYS", "")
    try:
        assert main(["cancel", sealed.turn_id, "--reason", "no key here", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["cancelled"] and printed["turn"]["message"] is None
        assert printed["turn"]["unreadable"]["message"]["key"] == "k1"
    finally:
        set_interface("python")
    assert keyed.get_turn(sealed.turn_id).status == "cancelled"
    assert keyed.get_turn(source.turn_id).status == "queued"


def test_turns_lists_every_turn_and_marks_what_does_not_open(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`durable-agent turns` and `turns --json` list every turn: without the key, the
    sealed ones marked as such; with it, a tampered one marked as tampered (before: the
    whole listing failed, exit 2)."""
    from durable_agent.cli import main
    from durable_agent.journal import set_interface

    clear = runtimes("").journal.create_turn("clear", "said in clear")
    keyed = runtimes(f"k1:{K1}")
    sealed = keyed.journal.create_turn("sealed", "said under k1")
    moved = keyed.journal.create_turn("moved", "replaced")
    _move_message(pg, sealed.turn_id, moved.turn_id)
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    from durable_agent.cli.console import out

    monkeypatch.setattr(out, "width", 1000)  # made at import: COLUMNS may have been narrow
    try:
        monkeypatch.setenv("DURABLE_AGENT_KEYS", "")
        assert main(["turns", "--json"]) == 0
        rows = {row["turn_id"]: row for row in json.loads(capsys.readouterr().out)}
        assert rows.keys() == {clear.turn_id, sealed.turn_id, moved.turn_id}
        assert rows[clear.turn_id]["message"] == "said in clear"
        assert "unreadable" not in rows[clear.turn_id]
        for turn_id in (sealed.turn_id, moved.turn_id):
            assert rows[turn_id]["message"] is None and rows[turn_id]["status"] == "queued"
            mark = rows[turn_id]["unreadable"]["message"]
            assert (mark["reason"], mark["key"]) == ("key_unavailable", "k1")
            assert turn_id in mark["detail"]
        assert main(["turns"]) == 0
        table = capsys.readouterr().out
        assert table.count(f"message {SEALED_K1}") == 2 and clear.turn_id in table

        monkeypatch.setenv("DURABLE_AGENT_KEYS", f"k1:{K1}")
        assert main(["turns", "--json"]) == 0
        rows = {row["turn_id"]: row for row in json.loads(capsys.readouterr().out)}
        assert rows[sealed.turn_id]["message"] == "said under k1"
        assert rows[moved.turn_id]["unreadable"]["message"]["reason"] == "tampered"
        assert main(["turns"]) == 0
        table = capsys.readouterr().out
        assert table.count(f"message {TAMPERED}") == 1
    finally:
        set_interface("python")
