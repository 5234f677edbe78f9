"""The application API on real Postgres and Redis: start_turn, get_turn, wait_for_turn."""

from __future__ import annotations

import socket
import time
from typing import Any

import psycopg
import pytest
import redis

from durable_agent.app.client import get_turn, start_turn, wait_for_turn
from durable_agent.errors import TurnNotFound
from durable_agent.journal import Claim, JournalStore, Leases
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import queued_turns


def _enqueued_at(pg: psycopg.Connection, turn_id: str) -> Any:
    row = pg.execute("SELECT enqueued_at FROM turns WHERE turn_id = %s", (turn_id,)).fetchone()
    assert row is not None
    return row[0]


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_start_turn_records_and_enqueues(
    settings: Settings, pg: psycopg.Connection, redis_client: redis.Redis
) -> None:
    """start_turn writes the turn to Postgres, puts its ids on the queue and notes when."""
    turn_id = start_turn("s", "hello", settings=settings)

    turn = get_turn(turn_id, settings=settings)
    assert (turn.session_id, turn.message, turn.status, turn.seq) == ("s", "hello", "queued", 0)
    assert queued_turns(redis_client, settings.queue) == [("s", turn_id)]
    assert _enqueued_at(pg, turn_id) is not None


def test_start_turn_with_own_id_is_idempotent(settings: Settings, store: JournalStore) -> None:
    """A retried start_turn with the caller's turn id returns the same, single turn."""
    first = start_turn("s", "hello", turn_id="turn_mine", settings=settings)
    again = start_turn("s", "hello", turn_id="turn_mine", settings=settings)

    assert first == again == "turn_mine"
    assert [t.turn_id for t in store.list_turns("s")] == ["turn_mine"]


def test_start_turn_with_broker_down_still_records_the_turn(
    settings: Settings, pg: psycopg.Connection, redis_client: redis.Redis
) -> None:
    """With no broker the turn is still recorded (queued, never enqueued), within 10 s, and
    the sweeper sends it once the broker is reachable."""
    down = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{_closed_port()}/0"})
    started = time.monotonic()

    turn_id = start_turn("s", "hello", settings=down)

    assert time.monotonic() - started < 10
    turn = get_turn(turn_id, settings=settings)
    assert (turn.status, turn.message) == ("queued", "hello")
    assert _enqueued_at(pg, turn_id) is None

    pg.execute(
        "UPDATE turns SET created_at = now() - interval '1 hour' WHERE turn_id = %s", (turn_id,)
    )
    assert runtime_for(settings).sweeper().sweep_once() == [("s", turn_id, "never enqueued")]
    assert queued_turns(redis_client, settings.queue) == [("s", turn_id)]


def test_get_turn_of_unknown_id_raises_turn_not_found(settings: Settings) -> None:
    """An unknown id is an error naming the id, not None."""
    with pytest.raises(TurnNotFound, match="turn_nope") as caught:
        get_turn("turn_nope", settings=settings)
    assert caught.value.turn_id == "turn_nope"


def test_wait_for_turn_times_out_naming_the_status(settings: Settings, store: JournalStore) -> None:
    """Waiting on a turn nobody runs raises TimeoutError that says it is still queued."""
    turn = store.create_turn("s", "hello")
    started = time.monotonic()

    with pytest.raises(TimeoutError, match=r"still queued after 0\.3s"):
        wait_for_turn(turn.turn_id, 0.3, settings=settings)

    assert time.monotonic() - started < 10


def test_wait_for_turn_returns_the_finished_turn(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    """A finished turn is returned with its reply."""
    turn = store.create_turn("s", "hello")
    claim = leases.claim(turn.turn_id, "w", 30.0)
    assert isinstance(claim, Claim)
    assert leases.finish(turn.turn_id, claim.epoch, "hi there") is not None

    done = wait_for_turn(turn.turn_id, 5, settings=settings)

    assert (done.status, done.reply) == ("done", "hi there")
