"""Live turns on a real Postgres: steps announced by LISTEN/NOTIFY as they commit, read by
``stream_turn`` in order, resumable from any step, and ``wait_for_turn`` woken by the end.

Where a test asserts that nothing was told, it first makes sure the watcher (or listener)
looked after the write: the watcher's store counts its reads, and a listener reads up to a
marker sent after the write. Nothing is left to a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from durable_agent import InvalidArgument, Turn, TurnEvent, TurnNotFound
from durable_agent.journal import Claim, JournalStore, Leases, Step, announce
from durable_agent.operate.live import stream_turn, wait_until_finished
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings

OWNER = "test-owner"
SLOW_POLL = 30.0  # far longer than any wait below: only an announcement can wake a watcher


def _claimed_turn(runtime: Runtime, session: str = "live") -> tuple[str, int]:
    turn = runtime.journal.create_turn(session, "hello")
    claim = runtime.leases.claim(turn.turn_id, OWNER, 30.0)
    assert isinstance(claim, Claim)
    return turn.turn_id, claim.epoch


def _write_step(store: JournalStore, turn_id: str, epoch: int, step: int) -> None:
    """Intent then outcome, as the runner writes a model step."""
    store.insert_intent(turn_id, epoch, step, "model", "llm", {"n": step}, "safe")
    store.record_outcome(turn_id, epoch, step, {"message": {"content": f"s{step}"}}, durable=False)


class CountingStore:
    """The journal store a watcher reads through, counting its reads (each counted once it
    returned): a read that started after a write sees that write."""

    def __init__(self, store: JournalStore) -> None:
        self.store = store
        self.turn_reads = 0
        self.step_reads = 0

    def get_turn(self, turn_id: str) -> Turn:
        turn = self.store.get_turn(turn_id)
        self.turn_reads += 1
        return turn

    def load_journal_from(self, turn_id: str, first: int) -> list[Step]:
        steps = self.store.load_journal_from(turn_id, first)
        self.step_reads += 1
        return steps


def _watch(runtime: Runtime, turn_id: str) -> tuple[CountingStore, Iterator[TurnEvent]]:
    counting = CountingStore(runtime.journal)
    events = stream_turn(
        counting,  # type: ignore[arg-type]
        runtime.announcements,
        runtime.with_spend,
        turn_id,
        poll_seconds=SLOW_POLL,
    )
    return counting, events


def _looked_again(runtime: Runtime, counting: CountingStore, turn_id: str) -> None:
    """Wake the watcher with an announcement that brings no news, twice, and wait until it
    has read each time: its second read started after everything written before this call,
    and whatever that read found has been handed out by the time this returns."""
    for _ in range(2):
        reads = counting.step_reads
        announce(runtime.database, f"step -1 {turn_id}")
        _until(lambda reads=reads: counting.step_reads > reads, timeout=5.0)


def _collect(events: Iterator[TurnEvent], into: list[TurnEvent]) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.extend(events), daemon=True)
    thread.start()
    return thread


def _until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_stream_yields_each_step_as_it_commits_then_the_end(
    runtime: Runtime, leases: Leases
) -> None:
    """Steps written one at a time reach a watcher (with a 30 s fallback poll) well within a
    second each, in order, once each; the end carries the reply."""
    turn_id, epoch = _claimed_turn(runtime)
    store = runtime.journal
    _write_step(store, turn_id, epoch, 0)  # recorded before the watcher came: caught up
    events: list[TurnEvent] = []
    counting, stream = _watch(runtime, turn_id)
    thread = _collect(stream, events)
    _until(lambda: len(events) == 1)

    for step in (1, 2, 3):
        store.insert_intent(turn_id, epoch, step, "model", "llm", {"n": step}, "safe")
        _looked_again(runtime, counting, turn_id)
        assert len(events) == step, "an intent is not a finished step"
        started = time.monotonic()
        store.record_outcome(turn_id, epoch, step, {"message": {"content": f"s{step}"}})
        _until(lambda step=step: len(events) == step + 1, timeout=2.0)
        assert time.monotonic() - started < 1.0
    leases.finish(turn_id, epoch, "all done")
    thread.join(timeout=5)

    assert not thread.is_alive()
    assert [e.kind for e in events] == ["step"] * 4 + ["end"]
    assert [e.id for e in events] == ["0", "1", "2", "3", "end"]
    end = events[-1]
    assert end.turn is not None and end.turn.status == "done" and end.turn.reply == "all done"
    assert end.turn.spend is not None and end.turn.spend.billed.calls == 4
    assert end.as_json()["event"] == "end" and events[0].as_json()["event"] == "step"


def test_resume_after_any_step_gives_the_rest_exactly_once(runtime: Runtime) -> None:
    """A finished turn streamed after step k gives steps k+1.. and the end; after the last
    step, only the end."""
    turn_id, epoch = _claimed_turn(runtime)
    for step in range(4):
        _write_step(runtime.journal, turn_id, epoch, step)
    runtime.leases.finish(turn_id, epoch, "bye")

    for after in (-1, 0, 2, 3, 10):
        ids = [e.id for e in runtime.stream_turn(turn_id, after_step=after)]
        assert ids == [str(s) for s in range(after + 1, 4)] + ["end"], after


def test_wait_for_turn_is_woken_by_the_end_not_a_poll(runtime: Runtime) -> None:
    """With a 30 s fallback poll, a waiter returns within a second of the turn's end."""
    turn_id, epoch = _claimed_turn(runtime)
    result: list[object] = []
    counting = CountingStore(runtime.journal)

    def wait() -> None:
        store: Any = counting
        result.append(wait_until_finished(store, runtime.announcements, turn_id, 20, SLOW_POLL))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    # its second read is the one after it subscribed: from then on only an announcement (or
    # the 30 s poll) wakes it
    _until(lambda: counting.turn_reads >= 2)
    assert result == []
    ended = time.monotonic()
    runtime.leases.fail(turn_id, epoch, "no luck")
    thread.join(timeout=5)

    assert time.monotonic() - ended < 1.0
    assert [getattr(t, "status", None) for t in result] == ["failed"]


def test_a_dropped_listening_connection_is_replaced_and_nothing_is_missed(
    runtime: Runtime, pg: psycopg.Connection
) -> None:
    """When Postgres drops the LISTEN connection, the process listens again and every watcher
    reads once more: steps recorded meanwhile still arrive, once each."""
    turn_id, epoch = _claimed_turn(runtime)
    events: list[TurnEvent] = []
    thread = _collect(runtime.stream_turn(turn_id, poll_seconds=SLOW_POLL), events)
    _until(lambda: runtime.announcements.listening)

    pg.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'durable-agent-listen' AND datname = current_database()"
    )
    _write_step(runtime.journal, turn_id, epoch, 0)
    _write_step(runtime.journal, turn_id, epoch, 1)
    _until(lambda: len(events) == 2, timeout=5.0)
    runtime.leases.finish(turn_id, epoch, "ok")
    thread.join(timeout=5)

    assert [e.id for e in events] == ["0", "1", "end"]


def test_many_watchers_share_one_listening_connection(
    runtime: Runtime, pg: psycopg.Connection
) -> None:
    """Twenty watchers of five turns use one LISTEN connection; each gets its turn's steps."""
    turns = [_claimed_turn(runtime, f"live-{i}") for i in range(5)]
    results: dict[int, list[TurnEvent]] = {i: [] for i in range(20)}
    threads = [
        _collect(runtime.stream_turn(turns[i % 5][0], poll_seconds=SLOW_POLL), results[i])
        for i in range(20)
    ]
    _until(lambda: runtime.announcements.listening)
    for turn_id, epoch in turns:
        _write_step(runtime.journal, turn_id, epoch, 0)
        runtime.leases.finish(turn_id, epoch, f"reply of {turn_id}")
    for thread in threads:
        thread.join(timeout=10)

    listening = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'durable-agent-listen' "
        "AND datname = current_database()"
    ).fetchone()
    assert listening == (1,)
    for i, events in results.items():
        assert [e.id for e in events] == ["0", "end"]
        assert events[-1].turn is not None
        assert events[-1].turn.reply == f"reply of {turns[i % 5][0]}"


def test_bad_arguments_are_refused_before_anything_is_read(runtime: Runtime) -> None:
    with pytest.raises(TurnNotFound):
        runtime.stream_turn("turn_missing")
    turn_id, _ = _claimed_turn(runtime)
    for bad in (-2, 1.5, True, "3"):
        with pytest.raises(InvalidArgument, match="after_step"):
            runtime.stream_turn(turn_id, after_step=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        runtime.stream_turn(turn_id, timeout=float("nan"))
    with pytest.raises(TimeoutError, match="still running"):
        list(runtime.stream_turn(turn_id, timeout=0.2))


def test_a_step_written_with_a_never_intent_is_announced(runtime: Runtime) -> None:
    """The worker writes a model step's outcome in the statement of the next step; when that
    is a never tool's intent the commit waits for the flush and the trigger stays silent, so
    the writer announces the step itself: a watcher sees it without waiting for a poll."""
    turn_id, epoch = _claimed_turn(runtime)
    journal = runtime.journal.for_claim(turn_id, epoch, empty=True)
    events: list[TurnEvent] = []
    counting, stream = _watch(runtime, turn_id)
    thread = _collect(stream, events)
    journal.insert_intent(0, "model", "llm", {}, "safe")
    journal.record_outcome(0, {"message": {"content": "call send_email"}})  # held back
    _looked_again(runtime, counting, turn_id)
    assert events == []
    journal.insert_intent(1, "tool", "send_email", {"to": "a"}, "never")  # carries step 0

    _until(lambda: len(events) == 1, timeout=2.0)
    assert [e.id for e in events] == ["0"]
    runtime.leases.fail(turn_id, epoch, "stop here")
    thread.join(timeout=5)


def test_a_never_outcome_is_announced_by_its_own_commit(
    runtime: Runtime, settings: Settings
) -> None:
    """A never tool's outcome is committed without waiting for the flush (the next flushed
    write takes it to disk), so the trigger announces it with its own commit; a never intent
    waits for the flush and announces the step it carried after it. Read on a connection of
    the test's own that listens, so what is announced when is certain."""
    turn_id, epoch = _claimed_turn(runtime)
    journal = runtime.journal.for_claim(turn_id, epoch, empty=True)
    with psycopg.connect(settings.database_url, autocommit=True) as listener:
        listener.execute("LISTEN durable_agent")

        def told() -> list[str]:
            """The steps announced so far: read up to a marker sent now, which arrives
            after every announcement committed before it."""
            listener.execute("SELECT pg_notify('durable_agent', 'marker')")
            steps: list[str] = []
            for notice in listener.notifies(timeout=5.0):
                if notice.payload == "marker":
                    return steps
                if notice.payload.startswith("step "):
                    steps.append(notice.payload.split()[1])
            raise AssertionError(f"the marker never came back (read {steps})")

        journal.insert_intent(0, "tool", "send_email", {"to": "a"}, "never")
        assert told() == []  # an intent is not announced
        journal.record_outcome(0, {"content": "sent"})
        assert told() == ["0"]  # by its own (unflushed) commit
        journal.insert_intent(1, "model", "llm", {}, "safe")
        journal.record_outcome(1, {"message": {"content": "call send_email"}})  # held back
        assert told() == []
        journal.insert_intent(2, "tool", "send_email", {"to": "b"}, "never")
        assert told() == ["1"]  # a flushed insert announces the step it carried
        journal.record_outcome(2, {"content": "sent"})
        assert told() == ["2"]
        journal.flush()  # nothing held: nothing more to tell
        assert told() == []


def test_the_sse_example_answers_a_reconnect_after_the_end_with_204(runtime: Runtime) -> None:
    """A real HTTP client reading the example endpoint: the stream of a finished turn ends
    with the ``end`` event; reconnecting with ``Last-Event-ID: end`` (as an EventSource does
    once the server closes) gets 204 No Content, which stops an EventSource, not a 400; an
    unknown turn is still 404."""
    import http.client

    from durable_agent_examples.live_sse import make_server

    turn_id, epoch = _claimed_turn(runtime)
    _write_step(runtime.journal, turn_id, epoch, 0)
    runtime.leases.finish(turn_id, epoch, "bye")
    server = make_server(runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def get(path: str, last: str | None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", path, headers={"Last-Event-ID": last} if last else {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    try:
        status, body = get(f"/turns/{turn_id}/events", None)
        assert status == 200 and body.decode().rstrip().split("\n\n")[-1].startswith("id: end")
        assert get(f"/turns/{turn_id}/events", "end") == (204, b"")
        assert get(f"/turns/{turn_id}/events", " end ")[0] == 204
        assert get("/turns/turn_nosuch/events", "end")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
