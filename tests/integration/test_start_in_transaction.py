"""start_turn(connection=...): the turn is the application's transaction's, and its message
goes out only once that transaction commits (real Postgres, real Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psycopg
import pytest
import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from durable_agent import start_turn
from durable_agent.errors import ConfigurationError, InvalidArgument
from durable_agent.journal import JournalStore
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import queued_turns

if TYPE_CHECKING:
    from conftest import DatabaseClock


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    """The application's engine, on the same database, through psycopg 3."""
    url = settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    app_engine = create_engine(url)
    with app_engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL)"))
    yield app_engine
    app_engine.dispose()


def _queued(redis_client: redis.Redis, settings: Settings) -> list[str]:
    return [turn_id for _, turn_id in queued_turns(redis_client, settings.queue)]


def _eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _order(session: Session, item: str = "a teapot") -> None:
    session.execute(text("INSERT INTO orders (item) VALUES (:item)"), {"item": item})


def test_session_commit_records_the_turn_then_sends_it_once(
    settings: Settings, engine: Engine, store: JournalStore, redis_client: redis.Redis
) -> None:
    with Session(engine) as session:
        _order(session)
        turn_id = start_turn("s1", "ship it", settings=settings, connection=session)
        # not visible outside the transaction, and nothing sent before the commit
        assert store.find_turn(turn_id) is None
        assert _queued(redis_client, settings) == []
        session.commit()
    assert _queued(redis_client, settings) == [turn_id]
    turn = store.get_turn(turn_id)
    assert turn.message_id is not None and turn.enqueued_at is not None  # marked as sent


def test_a_scoped_session_lends_its_current_session(
    settings: Settings, engine: Engine, redis_client: redis.Redis
) -> None:
    sessions = scoped_session(sessionmaker(engine))
    try:
        turn_id = start_turn("s1", "hi", settings=settings, connection=sessions)
        assert _queued(redis_client, settings) == []
        sessions.commit()
    finally:
        sessions.remove()
    assert _queued(redis_client, settings) == [turn_id]


def test_session_rollback_leaves_no_turn_and_sends_nothing(
    settings: Settings, engine: Engine, pg: psycopg.Connection, redis_client: redis.Redis
) -> None:
    with Session(engine) as session:
        _order(session)
        start_turn("s1", "ship it", settings=settings, connection=session)
        session.rollback()
        session.commit()  # a later commit in the same session rings nothing either
    with Session(engine) as session:
        start_turn("s2", "ship it", settings=settings, connection=session)
        # closed without a commit
    assert pg.execute("SELECT count(*) FROM turns").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert _queued(redis_client, settings) == []


def test_a_rolled_back_savepoint_takes_its_turn_with_it(
    settings: Settings, engine: Engine, store: JournalStore, redis_client: redis.Redis
) -> None:
    with Session(engine) as session:
        kept = start_turn("s1", "kept", settings=settings, connection=session)
        nested = session.begin_nested()
        dropped = start_turn("s2", "dropped", settings=settings, connection=session)
        nested.rollback()
        with session.begin_nested():  # a released savepoint keeps its turn
            released = start_turn("s3", "released", settings=settings, connection=session)
        session.commit()
    assert store.find_turn(dropped) is None
    assert sorted(_queued(redis_client, settings)) == sorted([kept, released])


def test_the_same_turn_id_twice_is_one_turn_and_one_message(
    settings: Settings, engine: Engine, redis_client: redis.Redis
) -> None:
    with Session(engine) as session:
        first = start_turn("s1", "hi", turn_id="t-1", settings=settings, connection=session)
        again = start_turn("s1", "hi", turn_id="t-1", settings=settings, connection=session)
        with pytest.raises(InvalidArgument, match="already used"):
            start_turn("s1", "other", turn_id="t-1", settings=settings, connection=session)
        _order(session)  # the application's transaction is still usable
        session.commit()
    assert first == again == "t-1"
    assert _queued(redis_client, settings) == ["t-1"]


def test_core_connection_commit_sends_and_rollback_does_not(
    settings: Settings, engine: Engine, store: JournalStore, redis_client: redis.Redis
) -> None:
    with engine.connect() as conn:
        rolled_back = start_turn("s1", "no", settings=settings, connection=conn)
        conn.rollback()
        committed = start_turn("s2", "yes", settings=settings, connection=conn)
        assert _queued(redis_client, settings) == []
        conn.commit()
    assert _eventually(lambda: _queued(redis_client, settings) == [committed])
    assert store.find_turn(rolled_back) is None
    assert _eventually(lambda: store.get_turn(committed).message_id is not None)


def test_core_connection_savepoint_rolled_back_sends_nothing_for_its_turn(
    settings: Settings, engine: Engine, store: JournalStore, redis_client: redis.Redis
) -> None:
    """The waiter sends only turns that became visible: one rolled back with a savepoint
    never does, and the waiter gives up on it after the sweeper's grace period."""
    with engine.connect() as conn:
        kept = start_turn("s1", "kept", settings=settings, connection=conn)
        nested = conn.begin_nested()
        dropped = start_turn("s2", "dropped", settings=settings, connection=conn)
        nested.rollback()
        conn.commit()
    waiters = [t for t in threading.enumerate() if t.name == "durable-agent-doorbell"]
    for waiter in waiters:
        waiter.join(timeout=15)
        assert not waiter.is_alive()
    assert store.find_turn(dropped) is None
    assert _queued(redis_client, settings) == [kept]


def test_psycopg_connection_leaves_the_doorbell_to_the_sweeper(
    settings: Settings, store: JournalStore, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    sweeper = runtime_for(settings).sweeper()
    with psycopg.connect(settings.database_url) as conn:
        turn_id = start_turn("s1", "hi", settings=settings, connection=conn)
        conn.rollback()
        assert store.find_turn(turn_id) is None
        turn_id = start_turn("s1", "hi", settings=settings, connection=conn)
        conn.commit()
    assert store.get_turn(turn_id).message_id is None
    assert _queued(redis_client, settings) == []
    clock.advance(sweeper.grace_seconds + 0.1)
    assert sweeper.sweep_once() == [("s1", turn_id, "never enqueued")]
    assert _queued(redis_client, settings) == [turn_id]


def test_psycopg_starting_the_turn_again_after_the_commit_sends_it_at_once(
    settings: Settings, store: JournalStore, redis_client: redis.Redis
) -> None:
    """The recipe for psycopg and Django (transaction.on_commit): a start by the same turn id
    after the commit finds the turn and sends it, without waiting for the sweeper."""
    with psycopg.connect(settings.database_url) as conn:
        turn_id = start_turn("s1", "hi", settings=settings, connection=conn)
        conn.commit()
    assert start_turn("s1", "hi", turn_id=turn_id, settings=settings) == turn_id
    assert _queued(redis_client, settings) == [turn_id]
    assert store.get_turn(turn_id).message_id is not None


def test_what_cannot_take_a_turn_is_refused_in_one_line(
    settings: Settings, engine: Engine, new_database: Callable[[], str]
) -> None:
    with (
        psycopg.connect(settings.database_url, autocommit=True) as conn,
        pytest.raises(InvalidArgument, match="autocommit"),
    ):
        start_turn("s1", "hi", settings=settings, connection=conn)
    with pytest.raises(InvalidArgument, match="SQLAlchemy Session or Connection"):
        start_turn("s1", "hi", settings=settings, connection=object())
    other_driver = create_engine("sqlite://")
    with (
        Session(other_driver) as session,
        pytest.raises(ConfigurationError, match=r"psycopg 3 driver .* uses sqlite\+pysqlite"),
    ):
        start_turn("s1", "hi", settings=settings, connection=session)
    other_driver.dispose()
    with (
        psycopg.connect(new_database()) as elsewhere,
        pytest.raises(ConfigurationError, match="would never run"),
    ):
        start_turn("s1", "hi", settings=settings, connection=elsewhere)
    with psycopg.connect(settings.database_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(InvalidArgument, match="already failed"):
            start_turn("s1", "hi", settings=settings, connection=conn)
