"""Payloads sealed at rest, on a real Postgres with a real turn worker, the scripted model
and the SMTP inbox: with a key configured the tables hold no message, reply, argument or
output in clear, and everything reads back as before; a ciphertext moved to another row,
or sealed with a key no longer held, fails with a clear error; an existing clear database
is sealed by `rekey`, and rotation while turns run loses and garbles nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from inprocess import CrashAt, SimulatedCrash

from durable_agent.app import operator as ops
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.errors import KeyUnavailable, PayloadTampered
from durable_agent.journal import MARK, SEALED_KEY, Sealer, StaticKeys, dumps, new_key
from durable_agent.operate.replay import replay_turn
from durable_agent.operate.spend import spend_of_turns
from durable_agent.operate.uncertain import list_uncertain
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.faults import CrashPoint
from durable_agent.testing import ScriptedModelServer, SmtpInbox

if TYPE_CHECKING:
    from conftest import DatabaseClock

MESSAGE = "Please email the note launch to ada@example.com"
REPLY = "Done: the note 'launch' was sent to ada@example.com."
SECRETS_IN_CLEAR = ["ada@example.com", "launch", "Please email", "Done: the note"]
K1, K2, K3 = new_key(), new_key(), new_key()


def _worker(runtime: Runtime, crash: tuple[int, CrashPoint] | None = None) -> TurnWorker:
    return runtime.build_turn_worker(faults=CrashAt(crash))


def _dump(pg: psycopg.Connection) -> str:
    """Every row of the tables that hold payloads, as text (what a dump or psql shows)."""
    parts = []
    for table in ("turns", "journal", "blobs", "approvals"):
        row = pg.execute(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} AS t")
        parts.append(str(row.fetchone()[0]))  # type: ignore[index]
    return "\n".join(parts)


def _handle_when_free(worker: TurnWorker, turn_id: str, clock: DatabaseClock) -> Any:
    for _ in range(10):
        delivery = worker.handle(turn_id)
        if delivery.outcome != "refused":
            return delivery
        clock.advance(10.0)
    raise AssertionError(f"turn {turn_id} still refused")


def test_a_sealed_turn_shows_nothing_in_clear_and_reads_back_as_before(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """A turn whose worker dies after sending the email, resumed by another: the reply,
    the journal, the uncertain inbox, the spend ledger, replay and the idempotency key
    are what they are without a key, and the tables hold none of it in clear."""
    runtime = runtimes(f"k1:{K1}")
    turn = runtime.journal.create_turn("s", MESSAGE)
    doomed = runtimes(f"k1:{K1}", lease_seconds=0.5)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            _worker(doomed, (3, "after_run")).handle(turn.turn_id)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash)

    delivery = _handle_when_free(_worker(runtime), turn.turn_id, clock)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert runtime.get_turn(turn.turn_id).reply == REPLY
    assert inbox.count == 1
    dump = _dump(pg)
    for text in SECRETS_IN_CLEAR:
        assert text not in dump, text
    # what operators filter and count on stays clear
    assert "send_email" in dump and "gpt-4o-mini" in dump and "prompt_tokens" in dump
    steps = runtime.journal.load_journal(turn.turn_id)
    assert steps[3].input["arguments"]["to"] == "ada@example.com"
    header = inbox.messages[0].headers
    sent_key = next(v for k, v in header.items() if k.lower() == "x-idempotency-key")
    assert sent_key == steps[3].input["idempotency_key"]
    assert steps[3].output["uncertain"] is True
    effects = list_uncertain(runtime.operator_store, runtime.journal, turn_id=turn.turn_id)
    assert [(e.step, e.tool) for e in effects] == [(3, "send_email")]
    spend = spend_of_turns(runtime.journal, {}, [turn.turn_id])[turn.turn_id]
    assert spend.as_json()["calls"] >= 4
    report = replay_turn(runtime.journal, runtime.agents, turn.turn_id, max_steps=20)
    assert report.ok, report.describe()
    # the same journal read without any encryption layer in the way is sealed everywhere
    raw = pg.execute(
        "SELECT input, output FROM journal WHERE turn_id = %s ORDER BY step", (turn.turn_id,)
    ).fetchall()
    assert all(SEALED_KEY in row[0] for row in raw)
    assert all(row[1] is None or SEALED_KEY in row[1] for row in raw)
    message = pg.execute("SELECT message FROM turns WHERE turn_id = %s", (turn.turn_id,))
    assert str(message.fetchone()[0]).startswith(MARK + "k1:")  # type: ignore[index]


def test_a_large_output_goes_to_a_sealed_blob_under_a_keyed_id(
    runtimes: Callable[..., Runtime], pg: psycopg.Connection
) -> None:
    runtime = runtimes(f"k1:{K1}")
    store = runtime.journal
    store.blob_threshold = 64
    turn = store.create_turn("s", "big")
    claim = runtime.leases.claim(turn.turn_id, "w", 30.0)
    big = {"content": "customer record " * 40}
    journal = store.for_claim(turn.turn_id, claim.epoch, empty=True)  # type: ignore[union-attr]
    journal.insert_intent(0, "tool", "lookup", {"q": "x"}, "safe")
    journal.record_outcome(0, big)
    journal.flush()

    (step,) = store.load_journal(turn.turn_id)
    assert step.output == big and step.blob is not None
    import hashlib

    assert step.blob != hashlib.sha256(dumps(big).encode()).hexdigest()
    assert "customer record" not in _dump(pg)


def test_a_ciphertext_moved_to_another_row_does_not_open(
    runtimes: Callable[..., Runtime], pg: psycopg.Connection
) -> None:
    runtime = runtimes(f"k1:{K1}")
    first = runtime.journal.create_turn("s", "the first message")
    second = runtime.journal.create_turn("s", "the second message")
    pg.execute(
        "UPDATE turns SET message = (SELECT message FROM turns WHERE turn_id = %s) "
        "WHERE turn_id = %s",
        (first.turn_id, second.turn_id),
    )
    assert runtime.get_turn(first.turn_id).message == "the first message"
    with pytest.raises(PayloadTampered, match=f"turn {second.turn_id} message.*'k1'"):
        runtime.journal.get_turn(second.turn_id)


def test_a_row_under_an_unknown_or_retired_key_names_the_key(
    runtimes: Callable[..., Runtime],
) -> None:
    turn = runtimes(f"k1:{K1}").journal.create_turn("s", "hello")
    with pytest.raises(KeyUnavailable, match=r"sealed with key 'k1'.*holds k3"):
        runtimes(f"k3:{K3}").journal.get_turn(turn.turn_id)
    with pytest.raises(KeyUnavailable, match=r"'k1'.*no keys are configured"):
        runtimes("").journal.get_turn(turn.turn_id)


def test_encryption_turned_on_for_a_clear_database_then_rotated(
    runtimes: Callable[..., Runtime],
    pg: psycopg.Connection,
    inbox: SmtpInbox,
) -> None:
    """Turns recorded clear keep reading while new ones are sealed; rekey seals the clear
    rows, a new key and rekey move every row to it, and the old key can then go."""
    clear = runtimes("")
    old_turn = clear.journal.create_turn("s1", MESSAGE)
    assert _worker(clear).handle(old_turn.turn_id).outcome == "done"
    assert "ada@example.com" in _dump(pg)

    sealed = runtimes(f"k1:{K1}")
    new_turn = sealed.journal.create_turn("s2", MESSAGE)
    assert _worker(sealed).handle(new_turn.turn_id).outcome == "done"
    assert sealed.get_turn(old_turn.turn_id).reply == REPLY  # mixed rows read side by side
    assert sealed.get_turn(new_turn.turn_id).reply == REPLY

    count = ops.rekey(batch=3, settings=sealed.settings)
    assert count.from_keys["clear"] > 0 and "k1" not in count.from_keys
    assert "ada@example.com" not in _dump(pg)

    rotated = runtimes(f"k2:{K2},k1:{K1}")
    count = ops.rekey(batch=3, settings=rotated.settings)
    assert count.from_keys["k1"] > 0 and "clear" not in count.from_keys
    keys = {
        Sealer(StaticKeys.parse(f"k2:{K2}")).key_of(value)
        for (value,) in pg.execute("SELECT input FROM journal UNION ALL SELECT output FROM journal")
        if value is not None
    }
    assert keys == {"k2"}
    only_new = runtimes(f"k2:{K2}")  # k1 retired
    for turn in (old_turn, new_turn):
        assert only_new.get_turn(turn.turn_id).reply == REPLY
        assert only_new.journal.load_journal(turn.turn_id)[3].input["arguments"]["to"] == (
            "ada@example.com"
        )
    entries = ops.audit_trail(action="rekey", settings=only_new.settings)
    assert len(entries) == 2 and entries[0].after["key"] == "k2"


def test_rotation_while_turns_run_loses_and_garbles_nothing(
    runtimes: Callable[..., Runtime], inbox: SmtpInbox
) -> None:
    """Turns sealed under k1 run on a worker with k2 (newest) while rekey moves the rows to
    k2 in batches of 2: every turn finishes with its reply, every email goes once, and every
    row then opens with k2 alone."""
    before = runtimes(f"k1:{K1}")
    turns = [before.journal.create_turn(f"s{i}", MESSAGE) for i in range(6)]
    for turn in turns[:2]:
        assert _worker(before).handle(turn.turn_id).outcome == "done"
    rotated = runtimes(f"k2:{K2},k1:{K1}")
    failures: list[BaseException] = []

    def run_rest() -> None:
        try:
            worker = _worker(rotated)
            for turn in turns[2:]:
                assert worker.handle(turn.turn_id).outcome == "done"
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=run_rest)
    thread.start()
    rekeys = 0
    while thread.is_alive() or rekeys == 0:
        ops.rekey(batch=2, settings=rotated.settings)
        rekeys += 1
    thread.join()
    ops.rekey(batch=2, settings=rotated.settings)  # what the last turns wrote under k2 already

    assert not failures, failures
    assert inbox.count == len(turns)
    only_k2 = runtimes(f"k2:{K2}")
    for turn in turns:
        assert only_k2.get_turn(turn.turn_id).reply == REPLY
        steps = only_k2.journal.load_journal(turn.turn_id)
        assert [s.name for s in steps] == ["llm", "lookup_note", "llm", "send_email", "llm"]


def test_the_command_line_reads_sealed_turns(
    runtimes: Callable[..., Runtime],
    settings: Settings,
    inbox: SmtpInbox,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """journal, watch, wait, turns, replay and spend with the key; without it one line
    naming the key, exit 2."""
    from durable_agent.cli import main
    from durable_agent.journal import set_interface

    runtime = runtimes(f"k1:{K1}")
    turn = runtime.journal.create_turn("s", MESSAGE)
    assert _worker(runtime).handle(turn.turn_id).outcome == "done"
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DURABLE_AGENT_TOOLS", "durable_agent_examples.email_tools")
    monkeypatch.setenv("DURABLE_AGENT_KEYS", f"k2:{K2},k1:{K1}")
    try:
        for argv in (
            ["journal", turn.turn_id, "--json"],
            ["watch", turn.turn_id, "--json", "--timeout", "5"],
            ["wait", turn.turn_id, "--timeout", "5"],
            ["turns", "--json"],
            ["replay", turn.turn_id],
            ["spend", "--json"],
        ):
            assert main(argv) == 0, argv
            printed = capsys.readouterr().out
            if argv[0] in ("journal", "watch"):
                assert "ada@example.com" in printed, argv
            if argv[0] == "wait":
                assert printed.strip() == REPLY
        monkeypatch.setenv("DURABLE_AGENT_KEYS", f"k3:{K3}")
        assert main(["journal", turn.turn_id]) == 2
        error = capsys.readouterr().err
        assert "'k1'" in error and "holds k3" in error and len(error.strip().splitlines()) == 1
    finally:
        set_interface("python")


def test_the_console_shows_sealed_turns_and_marks_a_missing_key(
    runtimes: Callable[..., Runtime], inbox: SmtpInbox
) -> None:
    from starlette.testclient import TestClient

    from durable_agent.web.app import create_app
    from durable_agent.web.auth import Authenticator

    token = "tok-0123456789abcdef"
    runtime = runtimes(f"k1:{K1}")
    turn = runtime.journal.create_turn("s", MESSAGE)
    assert _worker(runtime).handle(turn.turn_id).outcome == "done"
    headers = {"Authorization": f"Bearer {token}"}
    for keys, status, shown in (
        (f"k1:{K1}", 200, "ada@example.com"),
        (f"k3:{K3}", 200, "[sealed: key k1 unavailable]"),
    ):
        app = create_app(runtimes(keys), Authenticator({}, token))
        page = TestClient(app).get(f"/turns/{turn.turn_id}", headers=headers)
        assert page.status_code == status and shown in page.text, page.text[:2000]
