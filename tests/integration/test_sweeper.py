"""The sweeper on real Postgres and Redis: what it re-enqueues, how often, and one at a time."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import redis

import durable_agent.delivery.sweeper as sweeper_module
from durable_agent.journal import Claim, JournalStore, Leases
from durable_agent.runtime import Runtime, runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import queued_turns

if TYPE_CHECKING:
    from conftest import DatabaseClock


def _enqueued_at(pg: psycopg.Connection, turn_id: str) -> Any:
    row = pg.execute("SELECT enqueued_at FROM turns WHERE turn_id = %s", (turn_id,)).fetchone()
    assert row is not None
    return row[0]


def _backdate(pg: psycopg.Connection, turn_id: str, seconds: int = 3600) -> None:
    """Make the turn look recorded (and, if sent, enqueued) long ago."""
    pg.execute(
        "UPDATE turns SET created_at = created_at - make_interval(secs => %(s)s), "
        "enqueued_at = enqueued_at - make_interval(secs => %(s)s) WHERE turn_id = %(t)s",
        {"s": seconds, "t": turn_id},
    )


def test_never_enqueued_turn_is_sent_after_the_grace_period(
    settings: Settings,
    pg: psycopg.Connection,
    clock: DatabaseClock,
    store: JournalStore,
    redis_client: redis.Redis,
) -> None:
    """A turn recorded but never sent waits out the grace period, then is sent once."""
    settings = settings.model_copy(update={"requeue_after_seconds": 3.0})
    sweeper = runtime_for(settings).sweeper()
    assert sweeper.grace_seconds == 3.0
    turn = store.create_turn("s", "hi")

    assert sweeper.sweep_once() == []  # still within the grace period
    assert redis_client.llen(settings.queue) == 0
    assert _enqueued_at(pg, turn.turn_id) is None

    clock.advance(3.1)
    sent = sweeper.sweep_once()

    assert sent == [("s", turn.turn_id, "never enqueued")]
    assert redis_client.llen(settings.queue) == 1
    assert queued_turns(redis_client, settings.queue) == [("s", turn.turn_id)]
    assert _enqueued_at(pg, turn.turn_id) is not None
    assert sweeper.sweep_once() == []  # marked: not sent again on the next pass
    assert redis_client.llen(settings.queue) == 1


def test_expired_claim_is_resent_once_not_on_every_pass(
    runtime: Runtime,
    clock: DatabaseClock,
    store: JournalStore,
    leases: Leases,
    redis_client: redis.Redis,
) -> None:
    """A running turn whose lease ran out is sent again once; later passes leave it alone."""
    settings, sweeper = runtime.settings, runtime.sweeper()
    turn = store.create_turn("s", "hi")
    runtime.enqueue("s", turn.turn_id)
    assert isinstance(leases.claim(turn.turn_id, "dead-worker", 20.0), Claim)
    assert sweeper.sweep_once() == []  # its message went out and the lease is live

    clock.advance(20.1)
    sent = sweeper.sweep_once()

    assert sent == [("s", turn.turn_id, "claim expired")]
    assert queued_turns(redis_client, settings.queue) == [("s", turn.turn_id)] * 2
    for _ in range(3):
        assert sweeper.sweep_once() == []
    assert redis_client.llen(settings.queue) == 2
    assert store.get_turn(turn.turn_id).status == "running"


def test_turn_with_live_lease_is_not_sent(
    runtime: Runtime,
    pg: psycopg.Connection,
    store: JournalStore,
    leases: Leases,
    redis_client: redis.Redis,
) -> None:
    """An old, never-enqueued turn is left alone while a live lease holds it."""
    settings, sweeper = runtime.settings, runtime.sweeper()
    held = store.create_turn("held", "hi")
    free = store.create_turn("free", "hi")
    assert isinstance(leases.claim(held.turn_id, "busy-worker", 60.0), Claim)
    _backdate(pg, held.turn_id)
    _backdate(pg, free.turn_id)

    sent = sweeper.sweep_once()

    assert sent == [("free", free.turn_id, "never enqueued")]
    assert queued_turns(redis_client, settings.queue) == [("free", free.turn_id)]
    assert _enqueued_at(pg, held.turn_id) is None


def test_later_turn_of_a_session_waits_for_the_earlier_one(
    runtime: Runtime, pg: psycopg.Connection, store: JournalStore, redis_client: redis.Redis
) -> None:
    """Only the first open turn of a session is sent; the next one would only wait."""
    settings, sweeper = runtime.settings, runtime.sweeper()
    first = store.create_turn("s", "one")
    second = store.create_turn("s", "two")
    _backdate(pg, first.turn_id)
    _backdate(pg, second.turn_id)

    assert sweeper.sweep_once() == [("s", first.turn_id, "never enqueued")]
    assert queued_turns(redis_client, settings.queue) == [("s", first.turn_id)]
    assert _enqueued_at(pg, second.turn_id) is None


def test_two_sweepers_at_once_only_one_does_the_pass(
    settings: Settings,
    pg: psycopg.Connection,
    store: JournalStore,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While one sweeper is inside its pass, a second one (own connection) does nothing."""
    turns = [store.create_turn(f"s{i}", "hi") for i in range(3)]
    for turn in turns:
        _backdate(pg, turn.turn_id)

    real_send = sweeper_module.send
    inside = threading.Event()
    other_done = threading.Event()

    def slow_send(*args: Any, **kwargs: Any) -> None:
        inside.set()
        other_done.wait(timeout=30)
        real_send(*args, **kwargs)

    monkeypatch.setattr(sweeper_module, "send", slow_send)
    first_result: list[list[tuple[str, str, str]]] = []
    one, other = Runtime(settings), Runtime(settings)  # each with its own connections
    first = threading.Thread(target=lambda: first_result.append(one.sweeper().sweep_once()))
    first.start()
    try:
        assert inside.wait(timeout=30), "the first sweeper never reached send()"
        second_result = other.sweeper().sweep_once()
    finally:
        other_done.set()
        first.join(timeout=30)
        one.close()
        other.close()

    assert second_result == []
    assert len(first_result) == 1
    assert sorted(t for _, t, _ in first_result[0]) == sorted(t.turn_id for t in turns)
    queued = queued_turns(redis_client, settings.queue)
    assert sorted(queued) == sorted((t.session_id, t.turn_id) for t in turns)


def test_a_deferred_turn_is_sent_once_when_it_is_due(
    runtime: Runtime,
    clock: DatabaseClock,
    store: JournalStore,
    leases: Leases,
    redis_client: redis.Redis,
) -> None:
    """A turn given back after a model outage (not_before in the future) is not sent early,
    is sent once when due, and not again on later passes: deliveries schedule nothing."""
    settings = runtime.settings
    turn = store.create_turn("s-deferred", "hello")
    runtime.enqueue("s-deferred", turn.turn_id)
    redis_client.delete(settings.queue)  # the first delivery took its message
    claim = leases.claim(turn.turn_id, "w1", 30)
    assert isinstance(claim, Claim)
    assert leases.release(turn.turn_id, claim.epoch, 20.0, "model API down (will retry)")
    sweeper = runtime.sweeper()

    assert sweeper.sweep_once() == []  # not due yet
    clock.advance(19.0)
    assert sweeper.sweep_once() == []  # still not due
    clock.advance(1.1)
    assert sweeper.sweep_once() == [("s-deferred", turn.turn_id, "deferral due")]
    assert queued_turns(redis_client, settings.queue) == [("s-deferred", turn.turn_id)]
    assert sweeper.sweep_once() == []
    assert queued_turns(redis_client, settings.queue) == [("s-deferred", turn.turn_id)]


def _send(runtime: Runtime, clock: DatabaseClock, session: str, queue: str = "") -> str:
    """Record a turn and mark a message sent for it now; then move the clock on a second,
    so that sends are ordered."""
    turn = runtime.journal.create_turn(session, "hi", queue=queue or runtime.settings.queue)
    runtime.journal.mark_sent([turn.turn_id], [f"message-of-{turn.turn_id}"])
    clock.advance(1.0)
    return turn.turn_id


def _receive(runtime: Runtime, turn_id: str, receiver: str = "host:1:1") -> None:
    runtime.journal.record_receipt(turn_id, f"message-of-{turn_id}", receiver)


def test_a_backlog_is_not_sent_again(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """Fifty turns wait in the queue while a slow worker takes them in order: none is sent
    again, however long they wait (500 queued turns drew 538 re-sends before)."""
    turn_ids = [_send(runtime, clock, f"s{n}") for n in range(50)]
    sweeper = runtime.sweeper()
    for n, turn_id in enumerate(turn_ids[:20]):  # the worker has done the first twenty
        _receive(runtime, turn_id)
        claim = runtime.leases.claim(turn_id, "worker", 30.0)
        assert isinstance(claim, Claim)
        assert runtime.leases.finish(turn_id, claim.epoch, "done")
        clock.advance(0.5)
        if n % 5 == 0:
            assert sweeper.sweep_once() == []
    clock.advance(runtime.settings.lease_seconds + 1)
    assert sweeper.sweep_once() == []
    assert redis_client.llen(runtime.settings.queue) == 0


def test_a_message_behind_a_received_one_is_lost(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """Queues are FIFO: when a message sent later was received and this one was not (Redis
    lost it), this turn is sent again once a lease has passed."""
    lost = _send(runtime, clock, "s-lost")
    clock.advance(runtime.settings.lease_seconds)
    later = _send(runtime, clock, "s-later")
    _receive(runtime, later)
    sweeper = runtime.sweeper()

    assert sweeper.sweep_once() == [("s-lost", lost, "message lost")]
    assert queued_turns(redis_client, runtime.settings.queue) == [("s-lost", lost)]
    assert sweeper.sweep_once() == []  # its new message is unreceived, but the newest


def test_a_turn_resent_after_its_claim_expired_is_sent_again_if_that_message_is_lost(
    runtime: Runtime, clock: DatabaseClock, leases: Leases, redis_client: redis.Redis
) -> None:
    """The chaos test found it: a worker died holding a turn, the sweeper re-sent it
    ('claim expired', once per expiry), and Redis lost that message. The expired claim
    still names the dead worker, and the turn was never looked at again."""
    stuck = _send(runtime, clock, "s-stuck")
    _receive(runtime, stuck)
    assert isinstance(leases.claim(stuck, "dead-worker", 2.0), Claim)
    clock.advance(2.1)
    sweeper = runtime.sweeper()
    assert sweeper.sweep_once() == [("s-stuck", stuck, "claim expired")]
    redis_client.delete(runtime.settings.queue)  # Redis restarted empty
    clock.advance(runtime.settings.lease_seconds + 1)
    later = _send(runtime, clock, "s-later")
    _receive(runtime, later)

    assert sweeper.sweep_once() == [("s-stuck", stuck, "message lost")]
    assert queued_turns(redis_client, runtime.settings.queue) == [("s-stuck", stuck)]
    assert sweeper.sweep_once() == []


def test_an_idle_queue_gets_one_probe_per_requeue_after(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """Nothing sent to or received from a queue for requeue_after while turns wait unreceived
    (Redis restarted empty, or no worker serves it): the oldest one is sent again as a
    probe, one per requeue_after, not all of them every time."""
    first, second, _ = (_send(runtime, clock, f"s{n}") for n in range(3))
    sweeper = runtime.sweeper()
    assert sweeper.sweep_once() == []
    clock.advance(runtime.settings.requeue_after_seconds)
    assert sweeper.sweep_once() == [("s0", first, "queue idle")]
    assert sweeper.sweep_once() == []
    clock.advance(runtime.settings.requeue_after_seconds / 2)
    assert sweeper.sweep_once() == []
    clock.advance(runtime.settings.requeue_after_seconds / 2 + 1)
    assert sweeper.sweep_once() == [("s1", second, "queue idle")]
    assert redis_client.llen(runtime.settings.queue) == 2


def test_a_turn_whose_receiver_died_before_claiming_it_is_sent_again(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """A worker received the message and died before it claimed the turn: at once when the
    receiver was a process of this machine that is gone, else once a lease has passed."""
    from durable_agent.journal.holders import host_token

    dead_local = f"vm:{2**22 + 12345}:1#{host_token()}"
    alive_elsewhere = "other-host:42:1#0123456789ab"
    first = _send(runtime, clock, "s-dead")
    second = _send(runtime, clock, "s-far")
    _receive(runtime, first, dead_local)
    _receive(runtime, second, alive_elsewhere)
    sweeper = runtime.sweeper()

    assert sweeper.sweep_once() == [("s-dead", first, "receiver died")]
    clock.advance(runtime.settings.lease_seconds + 0.5)
    assert sweeper.sweep_once() == [("s-far", second, "receiver died")]
    assert sweeper.sweep_once() == []


def test_a_resent_turn_whose_receiver_died_is_sent_again(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """The turn's holder died, the sweeper sent it again, and the worker that received that
    message died too before it claimed the turn (a busy worker that had prefetched it): the
    turn still shows the first holder's expired claim, and is sent once more."""
    from durable_agent.journal.holders import host_token

    turn_id = _send(runtime, clock, "s-twice")
    claim = runtime.leases.claim(turn_id, "other-host:7:1#0123456789ab", 3.0)
    assert isinstance(claim, Claim)
    clock.advance(runtime.settings.lease_seconds + 0.5)
    sweeper = runtime.sweeper()
    assert sweeper.sweep_once() == [("s-twice", turn_id, "claim expired")]
    clock.advance(1.0)
    message_id = runtime.journal.get_turn(turn_id).message_id
    assert message_id is not None
    runtime.journal.record_receipt(turn_id, message_id, f"vm:{2**22 + 4321}:1#{host_token()}")

    assert sweeper.sweep_once() == [("s-twice", turn_id, "receiver died")]
    assert sweeper.sweep_once() == []


def test_a_turn_is_sent_again_to_its_own_queue(
    runtime: Runtime, clock: DatabaseClock, redis_client: redis.Redis
) -> None:
    """The sweeper of a worker on another queue re-sends a turn to the queue it belongs to,
    never to its own (a worker with other tools would take it)."""
    other_queue = f"{runtime.settings.queue}-billing"
    turn = runtime.journal.create_turn("s-billing", "hi", queue=other_queue)
    clock.advance(10)
    try:
        assert runtime.sweeper().sweep_once() == [("s-billing", turn.turn_id, "never enqueued")]
        assert redis_client.llen(runtime.settings.queue) == 0
        assert queued_turns(redis_client, other_queue) == [("s-billing", turn.turn_id)]
    finally:
        redis_client.delete(other_queue)
