"""send_event(connection=...) in-process on real Postgres and Redis, with no waker running:
who sends the woken turn after the application's commit, for each kind of connection (the
Session's after_commit, the Core Connection's waiter, the sweeper for psycopg), and that a
rollback leaves nothing to send. The same on real workers: tests/acceptance/
test_wakes_in_transaction.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from durable_agent import approve, send_event
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.errors import ConfigurationError, InvalidArgument, TurnNotFound
from durable_agent.journal import WaitStore, create_roles, role_names
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing.harness import queued_turns


@pytest.fixture
def wait_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"agents": "wait_agents", "tools": ""})


@pytest.fixture
def runtime(wait_settings: Settings) -> Iterator[Runtime]:
    runtime = Runtime(wait_settings)
    yield runtime
    runtime.close()


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    url = settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    app_engine = create_engine(url)
    yield app_engine
    app_engine.dispose()


@pytest.fixture
def parked(runtime: Runtime) -> Callable[[str], str]:
    """A turn of ``waiter`` parked for the event ``go`` (its message taken off the queue)."""
    worker: TurnWorker = runtime.build_turn_worker()

    def park(session_id: str) -> str:
        turn_id = runtime.start_turn(session_id, "hi", agent="waiter")
        assert worker.handle(turn_id).outcome == "parked"
        return turn_id

    return park


def _queued(client: redis.Redis, settings: Settings) -> list[str]:
    return [turn_id for _, turn_id in queued_turns(client, settings.queue)]


def _eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _send(settings: Settings, turn_id: str, connection: Any, event_id: str = "e1") -> str:
    sent = send_event(
        turn_id, "go", {"n": 1}, event_id=event_id, settings=settings, connection=connection
    )
    assert sent.on_commit
    return sent.outcome


def test_session_commit_sends_the_woken_turn_once_and_rollback_sends_nothing(
    wait_settings: Settings,
    runtime: Runtime,
    engine: Engine,
    parked: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    dropped, woken = parked("s1"), parked("s2")
    redis_client.delete(wait_settings.queue)
    with Session(engine) as session:
        assert _send(wait_settings, dropped, session) == "woke"
        session.rollback()
        nested = session.begin_nested()
        assert _send(wait_settings, dropped, session, "e2") == "woke"
        nested.rollback()
        assert _send(wait_settings, woken, session) == "woke"
        assert _queued(redis_client, wait_settings) == []
        assert runtime.journal.get_turn(woken).status == "waiting"  # not before the commit
        session.commit()
    assert _queued(redis_client, wait_settings) == [woken]
    turn = runtime.journal.get_turn(woken)
    assert (turn.status, turn.message_id is not None) == ("queued", True)
    assert runtime.journal.get_turn(dropped).status == "waiting"
    assert WaitStore(runtime.database).events(dropped) == []
    # the sweeper has nothing to add: the woken turn was sent, the other one still waits
    assert [t for _, t, _ in runtime.sweeper().sweep_once()] == []


def test_core_connection_commit_sends_the_woken_turn_and_rollback_sends_nothing(
    wait_settings: Settings,
    runtime: Runtime,
    engine: Engine,
    parked: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    dropped, woken = parked("s1"), parked("s2")
    redis_client.delete(wait_settings.queue)
    with engine.connect() as conn:
        assert _send(wait_settings, dropped, conn) == "woke"
        conn.rollback()
        assert _send(wait_settings, woken, conn) == "woke"
        assert _queued(redis_client, wait_settings) == []
        conn.commit()
    assert _eventually(lambda: _queued(redis_client, wait_settings) == [woken])
    assert runtime.journal.get_turn(dropped).status == "waiting"
    assert WaitStore(runtime.database).events(dropped) == []


def test_psycopg_commit_leaves_the_woken_turn_to_the_sweeper_without_grace(
    wait_settings: Settings,
    runtime: Runtime,
    parked: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    """No commit hook and no waker here: the woken turn is sent by the sweeper's next pass
    (reason ``woken``), however recent; a rolled-back one is never sent."""
    assert runtime.sweeper().grace_seconds > 1  # a pass within the grace still sends it
    dropped, woken = parked("s1"), parked("s2")
    redis_client.delete(wait_settings.queue)
    with psycopg.connect(wait_settings.database_url) as conn:
        assert _send(wait_settings, dropped, conn) == "woke"
        conn.rollback()
        assert _send(wait_settings, woken, conn) == "woke"
        conn.commit()
    assert _queued(redis_client, wait_settings) == []
    turn = runtime.journal.get_turn(woken)
    assert (turn.status, turn.enqueued_at) == ("queued", None)
    sent = runtime.sweeper().sweep_once()
    assert [(t, why) for _, t, why in sent] == [(woken, "woken")]
    assert _queued(redis_client, wait_settings) == [woken]
    assert runtime.journal.get_turn(dropped).status == "waiting"


def test_an_event_for_a_turn_started_in_the_same_transaction_is_kept_for_it(
    wait_settings: Settings, runtime: Runtime, engine: Engine, redis_client: redis.Redis
) -> None:
    redis_client.delete(wait_settings.queue)
    with Session(engine) as session:
        turn_id = runtime.start_turn("s1", "hi", agent="waiter", connection=session)
        sent = send_event(
            turn_id, "go", 1, event_id="e1", settings=wait_settings, connection=session
        )
        assert (sent.outcome, sent.turn_status) == ("kept", "queued")
        session.commit()
    assert _queued(redis_client, wait_settings) == [turn_id]  # the start's message, once
    assert runtime.build_turn_worker().handle(turn_id).outcome == "done"
    assert runtime.journal.get_turn(turn_id).reply == "got 1 (e1)"


def test_bad_calls_say_so_and_leave_the_transaction_usable(
    wait_settings: Settings, runtime: Runtime, engine: Engine, parked: Callable[[str], str]
) -> None:
    turn_id = parked("s1")
    with Session(engine) as session:
        with pytest.raises(TurnNotFound):
            send_event("nope", "go", settings=wait_settings, connection=session)
        with pytest.raises(InvalidArgument, match="never waits for the event 'stop'"):
            send_event(turn_id, "stop", settings=wait_settings, connection=session)
        with pytest.raises(InvalidArgument, match="connection= takes"):
            send_event(turn_id, "go", settings=wait_settings, connection=object())
        assert _send(wait_settings, turn_id, session) == "woke"  # still usable
        session.commit()
    assert runtime.journal.get_turn(turn_id).status == "queued"
    other = create_engine(
        wait_settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1).rsplit(
            "/", 1
        )[0]
        + "/postgres"
    )
    try:
        with other.connect() as conn, pytest.raises(ConfigurationError, match="send_event"):
            send_event(turn_id, "go", settings=wait_settings, connection=conn)
    finally:
        other.dispose()


def test_the_application_role_sends_events_in_its_transaction_but_cannot_decide(
    wait_settings: Settings, runtime: Runtime, parked: Callable[[str], str], database_url: str
) -> None:
    """On a connection of the application's role (``durable-agent roles``): the event goes
    through the SECURITY DEFINER function; a decision is refused, in its savepoint only."""
    names = role_names(f"da_{uuid.uuid4().hex[:10]}")
    create_roles(
        runtime.database, names, {k: "unused" for k in ("application", "worker", "operator")}
    )
    try:
        turn_id = parked("s1")
        info = psycopg.conninfo.conninfo_to_dict(database_url)
        app_url = f"postgresql://{names.application}@{info['host']}:{info['port']}/{info['dbname']}"
        with psycopg.connect(app_url) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                approve(turn_id, 0, settings=wait_settings, connection=conn)
            assert _send(wait_settings, turn_id, conn) == "woke"  # the transaction goes on
            conn.commit()
        assert runtime.journal.get_turn(turn_id).status == "queued"
        assert [e.event_id for e in WaitStore(runtime.database).events(turn_id)] == ["e1"]
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            for role in names:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
