"""Agents that wait and delegate, on real prefork workers: sleeps, events and child agents
park their turn (no claim, no slot, no broker message) and come back when they should.

Every test uses the example agents of ``durable_agent_examples.waiting_agents`` and their scripted
model (``waits_policy``); Postgres and Redis restarts use throwaway servers."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest
import redis
from durable_agent_examples.waiting_agents_policy import waits_policy

from durable_agent import TurnEnded, get_turn, send_event, start_turn, wait_for_turn
from durable_agent.journal import WaitStore
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import forget_queue, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

    from durable_agent.embedded import EmbeddedServices

AGENTS = "durable_agent_examples.waiting_agents"


def _waits_settings(stack: Stack, **update: object) -> Settings:
    stack.model.policy = waits_policy
    return stack.settings.model_copy(
        update={"agents": AGENTS, "sweep_interval_seconds": 0.2, **update}
    )


def _env() -> dict[str, str]:
    return {"DURABLE_AGENT_AGENTS": AGENTS}


def _queue_length(settings: Settings) -> int:
    client = redis.Redis.from_url(settings.broker_url)
    try:
        return int(client.llen(settings.queue))
    finally:
        client.close()


def _parked(settings: Settings, turn_id: str) -> bool:
    return get_turn(turn_id, settings=settings).status == "waiting"


def test_one_prefork_slot_runs_parent_child_and_continuation(stack: Stack, spawn: Spawn) -> None:
    """support asks research (an agent given as a tool): the parent parks, the one slot runs
    the child, the child's end wakes the parent, the same slot finishes it."""
    settings = _waits_settings(stack)
    spawn(settings=settings, pool="prefork", concurrency=1, **_env())
    turn_id = start_turn(
        "s-support", "What does the launch note say?", agent="support", settings=settings
    )
    turn = stack.wait_turn(turn_id, 30)
    assert turn.status == "done", stack.report(turn_id)
    assert turn.reply.startswith("Here is what I found. The note says:"), turn.reply
    children = WaitStore(stack.store.db).children_of([turn_id])
    assert [(c.agent, c.status, c.parent_step) for c in children] == [("research", "done", 1)]
    assert [(s.kind, s.name) for s in stack.journal(turn_id)] == [
        ("model", "llm"),
        ("wait", "research"),
        ("model", "llm"),
    ]


def test_a_child_on_its_own_queue_runs_on_another_worker(
    stack: Stack, spawn: Spawn, redis_client: redis.Redis
) -> None:
    """research on a queue of its own, served by a worker of its own: the support worker
    parks the parent and sends the child there; the child's end brings the parent back."""
    settings = _waits_settings(stack)
    far = f"{settings.queue}-research"
    env = {**_env(), "RESEARCH_QUEUE": far}
    try:
        spawn(settings=settings, name="support", DURABLE_AGENT_SERVE_AGENTS="support", **env)
        spawn(settings=settings, name="research", DURABLE_AGENT_SERVE_AGENTS="research", **env)
        turn_id = start_turn(
            "s-far", "What does the launch note say?", agent="support", settings=settings
        )
        turn = stack.wait_turn(turn_id, 30)
        assert turn.status == "done", stack.report(turn_id)
        [child] = WaitStore(stack.store.db).children_of([turn_id])
        child_turn = stack.store.get_turn(child.turn_id)
        assert child_turn.queue == far and child_turn.status == "done"
        assert (child_turn.received_by or "").startswith(
            "research-"
        ) or child_turn.lease_owner is None
        logs = {w.name: w.log_text() for w in stack.workers}
        assert child.turn_id in logs["research"] and f"turn {turn_id}: done" in logs["support"]
    finally:
        forget_queue(redis_client, far)


def test_a_reminder_sleeps_without_a_slot_or_a_message_and_wakes_once(
    stack: Stack, spawn: Spawn
) -> None:
    """The model decides to wait 2 seconds; while the turn sleeps the one slot runs another
    turn and Redis holds no message for the sleeper; it wakes and emails once."""
    settings = _waits_settings(stack)
    spawn(settings=settings, pool="prefork", concurrency=1, **_env())
    sleeper = start_turn(
        "s-remind", "Remind ada@example.com in 2 seconds", agent="reminder", settings=settings
    )
    wait_until(lambda: _parked(settings, sleeper), 20, "the reminder to park")
    other = start_turn(
        "s-other", "What does the launch note say?", agent="support", settings=settings
    )
    assert stack.wait_turn(other, 20).status == "done", stack.report(other)
    assert _parked(settings, sleeper) and _queue_length(settings) == 0
    turn = stack.wait_turn(sleeper, 20)
    assert turn.status == "done" and turn.reply == "Reminder sent.", stack.report(sleeper)
    assert stack.subjects() == ["Reminder"]
    until = stack.journal(sleeper)[1].input["until"]
    assert stack.journal(sleeper)[1].finished_at.isoformat() >= until


@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_an_event_before_during_or_after_the_wait(stack: Stack, spawn: Spawn, when: str) -> None:
    """payment_settled sent before the turn waits (kept, read without parking), while it
    waits (wakes it at once), or after it timed out (the turn ended: refused clearly)."""
    settings = _waits_settings(stack)
    timeout = {"CHECKOUT_SETTLE_SECONDS": "1.5"} if when == "after" else {}
    spawn(settings=settings, pool="prefork", concurrency=2, **_env(), **timeout)
    runtime = runtime_for(settings)
    session = f"s-pay-{uuid.uuid4().hex[:6]}"
    if when == "before":
        turn_id = runtime.journal.create_turn(
            session, "order 7", queue=settings.queue, agent="checkout"
        ).turn_id
        sent = send_event(
            turn_id, "payment_settled", {"payment_id": "p7"}, event_id="p7", settings=settings
        )
        assert sent.outcome == "kept"
        runtime.enqueue(session, turn_id, settings.queue)
    else:
        turn_id = start_turn(session, "order 7", agent="checkout", settings=settings)
    if when == "during":
        wait_until(lambda: _parked(settings, turn_id), 20, "the checkout to park")
        started = time.monotonic()
        sent = send_event(
            turn_id, "payment_settled", {"payment_id": "p7"}, event_id="p7", settings=settings
        )
        assert sent.outcome == "woke"
    turn = stack.wait_turn(turn_id, 30)
    if when == "during":
        assert time.monotonic() - started < 5
    assert turn.status == "done", stack.report(turn_id)
    if when == "after":
        assert turn.reply.startswith("The payment did not settle within 1.5 seconds")
        assert stack.subjects() == []
    else:
        assert turn.reply == "Payment p7 settled; the receipt went to ada@example.com."
        assert stack.subjects() == ["Receipt"]
    with pytest.raises(TurnEnded, match="has ended"):
        send_event(turn_id, "payment_settled", {}, event_id="late", settings=settings)


def test_duplicate_events_and_a_sender_racing_the_waker(stack: Stack, spawn: Spawn) -> None:
    """Twenty threads send the same event id while the turn parks: one event is recorded,
    read once, one receipt goes out; nothing is lost whoever comes first."""
    settings = _waits_settings(stack)
    spawn(settings=settings, pool="prefork", concurrency=2, **_env())
    for n in range(5):
        turn_id = start_turn(f"s-race-{n}", "order 9", agent="checkout", settings=settings)
        outcomes: list[str] = []
        barrier = threading.Barrier(4)

        def send(
            outcomes: list[str] = outcomes,
            turn_id: str = turn_id,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            sent = send_event(
                turn_id, "payment_settled", {"payment_id": "p9"}, event_id="p9", settings=settings
            )
            outcomes.append(sent.outcome)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes).count("duplicate") == 3, outcomes
        turn = stack.wait_turn(turn_id, 30)
        assert turn.status == "done", stack.report(turn_id)
        events = WaitStore(stack.store.db).events(turn_id)
        assert [(e.event_id, e.consumed_step) for e in events] == [("p9", 0)]
    assert stack.subjects() == ["Receipt"] * 5


def test_turns_sleeping_through_a_postgres_restart_wake_once(
    stack: Stack, spawn: Spawn, own_postgres: EmbeddedServices
) -> None:
    settings = _waits_settings(stack, database_url=own_postgres.database_url)
    spawn(settings=settings, pool="prefork", concurrency=2, **_env())
    turn_ids = [
        start_turn(
            f"s-pg-{n}", "Remind ada@example.com in 3 seconds", agent="reminder", settings=settings
        )
        for n in range(4)
    ]
    wait_until(lambda: all(_parked(settings, t) for t in turn_ids), 30, "all four to park")
    own_postgres.restart_postgres(kill=True, downtime=1.0)
    for turn_id in turn_ids:
        turn = wait_for_turn(turn_id, 60, settings=settings)
        assert turn.status == "done", stack.logs()
    assert stack.subjects() == ["Reminder"] * 4


def test_turns_sleeping_while_redis_is_emptied_wake_once(
    stack: Stack, spawn: Spawn, own_redis: EmbeddedServices
) -> None:
    """Redis holds no message for a sleeping turn, so emptying it loses nothing: the
    sweeper wakes them from Postgres."""
    settings = _waits_settings(stack, broker_url=own_redis.broker_url)
    spawn(settings=settings, pool="prefork", concurrency=2, **_env())
    turn_ids = [
        start_turn(
            f"s-redis-{n}",
            "Remind ada@example.com in 3 seconds",
            agent="reminder",
            settings=settings,
        )
        for n in range(4)
    ]
    wait_until(lambda: all(_parked(settings, t) for t in turn_ids), 30, "all four to park")
    client = redis.Redis.from_url(own_redis.broker_url)
    client.flushall()
    client.close()
    for turn_id in turn_ids:
        turn = wait_for_turn(turn_id, 60, settings=settings)
        assert turn.status == "done", stack.logs()
    assert stack.subjects() == ["Reminder"] * 4
