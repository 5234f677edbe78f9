"""JournalStore on a real Postgres: turn placement, one-query loads, blobs and epoch fencing."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg.rows import namedtuple_row

from durable_agent.errors import LeaseLost
from durable_agent.journal import Claim, Database, JournalStore, Leases
from durable_agent.journal import db as db_module
from durable_agent.settings import Settings

OWNER = "test-owner"


def _claim(leases: Leases, turn_id: str, owner: str = OWNER, lease: float = 30.0) -> int:
    claim = leases.claim(turn_id, owner, lease)
    assert isinstance(claim, Claim), claim
    return claim.epoch


def _rows(pg: psycopg.Connection, turn_id: str) -> list[Any]:
    cursor = pg.cursor(row_factory=namedtuple_row)
    return cursor.execute(
        "SELECT step, status, output, output_blob, epoch FROM journal "
        "WHERE turn_id = %s ORDER BY step",
        (turn_id,),
    ).fetchall()


def test_create_turn_numbers_turns_within_a_session(store: JournalStore) -> None:
    """Turns of one session get seq 0, 1, 2; another session starts again at 0."""
    turns = [store.create_turn("s1", f"message {i}") for i in range(3)]
    other = store.create_turn("s2", "elsewhere")

    assert [t.seq for t in turns] == [0, 1, 2]
    assert other.seq == 0
    assert all(t.status == "queued" and t.lease_epoch == 0 and t.attempts == 0 for t in turns)
    assert [t.turn_id for t in store.list_turns("s1")] == [t.turn_id for t in turns]


def test_concurrent_creates_in_one_session_get_distinct_seqs(settings: Settings) -> None:
    """Eight threads, each on its own connection, create turns at once: seqs 0..7, no error."""
    n = 8
    barrier = threading.Barrier(n)
    seqs: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        db = Database(settings.database_url)
        try:
            own_store = JournalStore(db)
            barrier.wait(timeout=30)
            turn = own_store.create_turn("busy", f"message {i}")
            with lock:
                seqs.append(turn.seq)
        except BaseException as error:
            with lock:
                errors.append(error)
        finally:
            db.close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors, errors
    assert sorted(seqs) == list(range(n))


def test_create_turn_with_explicit_id_is_idempotent(store: JournalStore) -> None:
    """The same turn id submitted twice returns the same turn; a clashing reuse is refused."""
    first = store.create_turn("s", "hello", turn_id="turn_fixed")
    again = store.create_turn("s", "hello", turn_id="turn_fixed")

    assert again == first
    assert len(store.list_turns("s")) == 1
    with pytest.raises(ValueError, match="already used"):
        store.create_turn("s", "another message", turn_id="turn_fixed")


def test_load_journal_is_one_query_in_step_order(
    store: JournalStore, leases: Leases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1000-step journal loads with one statement, sorted by step."""
    turn = store.create_turn("s", "long")
    epoch = _claim(leases, turn.turn_id)
    n = 1000
    for step in range(n):
        store.insert_done(
            turn.turn_id, epoch, step, "tool", "lookup_note", {"i": step}, "safe", {"out": step}
        )

    statements: list[str] = []
    real_run = db_module._run

    def count(conn: Any, query: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(query.name)
        return real_run(conn, query, params, *args, **kwargs)

    monkeypatch.setattr(db_module, "_run", count)
    steps = store.load_journal(turn.turn_id)
    monkeypatch.undo()

    assert len(statements) == 1, statements
    assert [s.step for s in steps] == list(range(n))
    assert [s.output for s in steps] == [{"out": i} for i in range(n)]
    assert [s.input for s in steps] == [{"i": i} for i in range(n)]
    assert all(s.epoch == epoch and s.status == "done" for s in steps)


def test_a_step_is_written_only_after_the_one_before_it_is_done(
    store: JournalStore, leases: Leases, settings: Settings
) -> None:
    """The guard against building on steps a Postgres crash took away: a writer whose
    journal lost its tail (simulated by deleting it) cannot write past the gap."""
    turn = store.create_turn("s", "m")
    epoch = _claim(leases, turn.turn_id)
    store.insert_intent(turn.turn_id, epoch, 0, "model", "llm", {}, "safe")
    with pytest.raises(LeaseLost, match="the journal lost its last writes"):
        store.insert_intent(turn.turn_id, epoch, 1, "tool", "t", {}, "safe")  # 0 not done
    store.record_outcome(turn.turn_id, epoch, 0, {"ok": 1})
    store.insert_intent(turn.turn_id, epoch, 1, "tool", "t", {}, "never")
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM journal WHERE step = 1")  # the crash took step 1
    with pytest.raises(LeaseLost, match="the journal lost its last writes"):
        store.record_outcome(turn.turn_id, epoch, 1, {"ok": 2})
    with pytest.raises(LeaseLost, match="the journal lost its last writes"):
        store.insert_intent(turn.turn_id, epoch, 2, "model", "llm", {}, "safe")
    assert [s.step for s in store.load_journal(turn.turn_id)] == [0]


def test_large_outputs_go_to_blobs_and_load_back_identical(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """An output above blob_threshold is stored once by hash; the row keeps only the hash."""
    turn = store.create_turn("s", "big")
    epoch = _claim(leases, turn.turn_id)
    big = {"content": "x" * (store.blob_threshold * 3), "rows": list(range(200))}
    small = {"content": "fits in the row"}

    store.insert_intent(turn.turn_id, epoch, 0, "tool", "fetch", {"a": 1}, "safe")
    store.record_outcome(turn.turn_id, epoch, 0, big)
    store.insert_done(turn.turn_id, epoch, 1, "tool", "fetch", {"a": 2}, "safe", big)
    store.insert_done(turn.turn_id, epoch, 2, "tool", "fetch", {"a": 3}, "safe", small)

    rows = _rows(pg, turn.turn_id)
    assert [r.output for r in rows[:2]] == [None, None]
    assert rows[0].output_blob is not None and rows[0].output_blob == rows[1].output_blob
    assert rows[2].output == small and rows[2].output_blob is None
    blobs = pg.execute("SELECT sha256, size_bytes FROM blobs").fetchall()
    assert [sha for sha, _ in blobs] == [rows[0].output_blob]
    assert blobs[0][1] > store.blob_threshold

    steps = store.load_journal(turn.turn_id)
    assert [s.output for s in steps] == [big, big, small]
    assert [s.blob for s in steps] == [rows[0].output_blob, rows[0].output_blob, None]


def test_write_with_stale_epoch_raises_and_writes_nothing(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """After a new claim moved the epoch on, the old epoch can neither add nor finish steps."""
    turn = store.create_turn("s", "fenced")
    old = _claim(leases, turn.turn_id)
    store.insert_intent(turn.turn_id, old, 0, "tool", "send_email", {"to": "a"}, "never")
    # Let the old claim's lease run out, then another owner takes the turn over.
    pg.execute(
        "UPDATE turns SET lease_expires_at = now() - interval '1 second' WHERE turn_id = %(t)s",
        {"t": turn.turn_id},
    )
    new = _claim(leases, turn.turn_id, owner="other-owner")
    assert new == old + 1

    with pytest.raises(LeaseLost, match=f"holds epoch {old}, the turn is at epoch {new}"):
        store.insert_intent(turn.turn_id, old, 1, "model", "llm", {"m": 1}, "safe")
    with pytest.raises(LeaseLost, match=f"holds epoch {old}"):
        store.insert_done(turn.turn_id, old, 1, "tool", "lookup_note", {}, "safe", {"c": 1})
    with pytest.raises(LeaseLost, match=f"holds epoch {old}"):
        store.record_outcome(turn.turn_id, old, 0, {"content": "sent"})

    rows = _rows(pg, turn.turn_id)
    assert [(r.step, r.status, r.output, r.epoch) for r in rows] == [(0, "intent", None, old)]
    # the current epoch still writes
    store.record_outcome(turn.turn_id, new, 0, {"content": "sent"})
    assert [(r.step, r.status, r.epoch) for r in _rows(pg, turn.turn_id)] == [(0, "done", new)]


def test_second_intent_at_same_step_is_rejected_by_primary_key(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """Two writers cannot both record step 0: the second intent fails, naming the primary key."""
    turn = store.create_turn("s", "twice")
    epoch = _claim(leases, turn.turn_id)
    store.insert_intent(turn.turn_id, epoch, 0, "tool", "send_email", {"to": "a"}, "never")

    with pytest.raises(LeaseLost, match=r"primary key \(turn_id, step\)"):
        store.insert_intent(turn.turn_id, epoch, 0, "tool", "send_email", {"to": "b"}, "never")

    rows = _rows(pg, turn.turn_id)
    assert len(rows) == 1
    steps = store.load_journal(turn.turn_id)
    assert steps[0].input == {"to": "a"}


def test_record_outcome_on_a_done_step_is_rejected(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """An outcome is recorded once: a second record_outcome raises and keeps the first."""
    turn = store.create_turn("s", "once")
    epoch = _claim(leases, turn.turn_id)
    store.insert_intent(turn.turn_id, epoch, 0, "tool", "lookup_note", {"name": "x"}, "safe")
    store.record_outcome(turn.turn_id, epoch, 0, {"content": "first"})

    with pytest.raises(LeaseLost, match="outcome of step 0"):
        store.record_outcome(turn.turn_id, epoch, 0, {"content": "second"})

    assert [s.output for s in store.load_journal(turn.turn_id)] == [{"content": "first"}]


def test_a_model_or_safe_outcome_goes_with_the_next_write_and_a_never_outcome_at_once(
    pg: psycopg.Connection, store: JournalStore, leases: Leases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ClaimedJournal holds a model or safe outcome back and writes it in the statement of the
    next step (one round trip for two rows); a never tool's outcome is written at once."""
    turn = store.create_turn("s", "held")
    journal = store.for_claim(turn.turn_id, _claim(leases, turn.turn_id), empty=True)
    statements: list[str] = []
    real_run = db_module._run

    def count(conn: Any, query: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(query.name)
        return real_run(conn, query, params, *args, **kwargs)

    monkeypatch.setattr(db_module, "_run", count)
    journal.insert_intent(0, "model", "llm", {}, "safe")
    journal.record_outcome(0, {"message": "call send_email"})
    assert [(r.step, r.status) for r in _rows(pg, turn.turn_id)] == [(0, "intent")]  # held
    journal.insert_intent(1, "tool", "send_email", {"to": "a"}, "never")
    assert [(r.step, r.status) for r in _rows(pg, turn.turn_id)] == [(0, "done"), (1, "intent")]
    journal.record_outcome(1, {"content": "sent"})  # never: at once
    assert _rows(pg, turn.turn_id)[1].status == "done"
    journal.insert_intent(2, "model", "llm", {}, "safe")
    journal.record_outcome(2, {"message": "done"})
    journal.flush()
    journal.flush()  # nothing left to write
    monkeypatch.undo()

    assert statements == [
        "insert_step",
        "finish_and_insert_step",
        "announce",  # after a flushed write (a NOTIFY inside it would hold its flush)
        "finish_step",  # the never outcome: at once, not waiting for the flush
        "insert_step",
        "finish_step",
    ]
    steps = store.load_journal(turn.turn_id)
    assert [(s.step, s.status, s.output) for s in steps] == [
        (0, "done", {"message": "call send_email"}),
        (1, "done", {"content": "sent"}),
        (2, "done", {"message": "done"}),
    ]


def test_a_held_outcome_is_fenced_with_the_write_it_goes_with(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """After a takeover, the old claim's next write fails and takes its held outcome with it:
    neither row changes."""
    turn = store.create_turn("s", "fenced held")
    old = _claim(leases, turn.turn_id)
    journal = store.for_claim(turn.turn_id, old, empty=True)
    journal.insert_intent(0, "tool", "lookup_note", {}, "safe")
    journal.record_outcome(0, {"content": "note"})
    pg.execute(
        "UPDATE turns SET lease_expires_at = now() - interval '1 second' WHERE turn_id = %(t)s",
        {"t": turn.turn_id},
    )
    new = _claim(leases, turn.turn_id, owner="other-owner")

    with pytest.raises(
        LeaseLost,
        match=f"outcome of step 0 and intent of step 1 rejected: this writer holds epoch {old}, "
        f"the turn is at epoch {new}",
    ):
        journal.insert_intent(1, "model", "llm", {}, "safe")
    assert [(r.step, r.status, r.output) for r in _rows(pg, turn.turn_id)] == [(0, "intent", None)]


def test_the_turn_ends_only_with_its_held_last_step(
    pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """The reply's model step, held back, is written by end_turn itself; if its intent is
    gone (a Postgres crash took it), the turn does not end with a reply its journal lacks."""
    for lose_it in (False, True):
        turn = store.create_turn(f"s-end-{lose_it}", "m")
        epoch = _claim(leases, turn.turn_id)
        journal = store.for_claim(turn.turn_id, epoch, empty=True)
        journal.insert_intent(0, "model", "llm", {}, "safe")
        journal.record_outcome(0, {"message": {"content": "the reply"}})
        if lose_it:
            pg.execute("DELETE FROM journal WHERE turn_id = %s", (turn.turn_id,))

        ended = leases.finish(turn.turn_id, epoch, "the reply", journal.take_held())

        after = store.get_turn(turn.turn_id)
        if lose_it:
            assert ended is None and after.status == "running"
            error = store.lost(turn.turn_id, epoch, "the reply")
            assert "the journal lost its last writes" in str(error)
        else:
            assert ended is not None and after.status == "done"
            [step] = store.load_journal(turn.turn_id)
            assert (step.status, step.output) == ("done", {"message": {"content": "the reply"}})


def test_a_read_back_model_step_equals_the_live_one_down_to_the_order_of_its_keys(
    store: JournalStore, leases: Leases
) -> None:
    """A loop gets from ctx.model() the same object live and on replay, key order included
    (a loop that serialises it without sorting sends the same text either way): live
    values are put in jsonb's key order, and a read-back one is returned as Postgres gives it."""
    from durable_agent.step.runner import StepRunner
    from durable_agent.step.tools import ToolRegistry
    from durable_agent.testing import ClaimHeld

    def keys(value: Any) -> Any:
        if isinstance(value, dict):
            return [(k, keys(v)) for k, v in value.items()]
        if isinstance(value, list):
            return [keys(v) for v in value]
        return value

    answer = {
        "usage": {"total_tokens": 3, "prompt_tokens": 1},
        "message": {"role": "assistant", "content": "hi", "tool_calls": [{"zeta": 1, "a": 2}]},
        "model": "m",
        "finish_reason": "stop",
        "é": "not ascii",
        "bb": "same length as é in UTF-8",
    }
    request = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    turn = store.create_turn("s-order", "hello")
    epoch = _claim(leases, turn.turn_id)
    live_runner = StepRunner(
        store.for_claim(turn.turn_id, epoch, empty=True), tools=ToolRegistry(), guard=ClaimHeld()
    )
    live = live_runner.model_step(request, lambda _: dict(answer))
    live_runner.journal.flush()

    replay = StepRunner(
        store.for_claim(turn.turn_id, epoch), tools=ToolRegistry(), guard=ClaimHeld()
    )
    read_back = replay.model_step(request, lambda _: pytest.fail("read back, not called"))

    assert read_back == live == answer
    assert keys(read_back) == keys(live)
    assert list(live) == ["bb", "é", "model", "usage", "message", "finish_reason"]
