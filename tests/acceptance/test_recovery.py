"""No turn is lost, and none runs forever: Postgres, not Redis, finds turns to resume.

A dead worker's message stays unacked in Redis for the visibility timeout (an hour by
default); the sweeper inside every worker re-enqueues the turn once its lease expired. A turn
that keeps killing its worker ends as failed. A live worker's heartbeat keeps its claim
through a call longer than the lease, and a message lost from Redis is sent again.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import redis

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


def _unacked_in_redis(client: redis.Redis, turn_id: str) -> bool:
    """Is a copy of the turn's message in kombu's ``unacked`` hash (fetched, never acked)?"""
    return any(turn_id.encode() in payload for _, payload in client.hscan_iter("unacked"))


def test_sweeper_recovers_a_killed_worker_long_before_the_visibility_timeout(
    stack: Stack, spawn: Spawn, redis_client: redis.Redis
) -> None:
    """SIGKILL the whole worker during its first model call: the message stays unacked in
    Redis (visibility timeout one hour), yet a second worker's sweeper re-enqueues the turn
    once the 3 s lease expired, and the turn finishes within 20 s."""
    assert stack.settings.visibility_timeout_seconds == 3600
    assert stack.settings.lease_seconds == 3.0
    first = spawn()
    stack.model.hold()
    turn_id = start_turn("s-killed", stack.message, settings=stack.settings)
    stack.model.wait_for_waiting(1, timeout=20)
    assert _unacked_in_redis(redis_client, turn_id), stack.report(turn_id)

    first.kill(signal.SIGKILL)
    killed_at = time.monotonic()
    assert stack.wait_exit(first, 10) == -signal.SIGKILL
    stack.model.release()
    second = spawn()
    turn = stack.wait_turn(turn_id, 20)
    elapsed = time.monotonic() - killed_at

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert elapsed < 20, f"recovered after {elapsed:.1f}s\n{report}"
    assert f"sweeper enqueued {turn_id} (claim expired)" in second.log_text(), report
    # the dead worker's copy is still unacked: Redis did not deliver it again
    assert _unacked_in_redis(redis_client, turn_id), report
    assert (turn.attempts, turn.crashes) == (2, 1), report
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert stack.subjects() == [stack.subject], report
    # the interrupted step-0 call is the only request sent twice
    assert stack.model.request_count == 4 and stack.model.repeated_requests() == 1, report


def test_a_turn_that_keeps_killing_its_worker_fails(stack: Stack, spawn: Spawn) -> None:
    """Every worker dies at step 1 (CRASH_AT=1:before_run). With max_crashes=2 the third
    worker gives up: the turn is failed, its error names the crash count, and the
    finished step-0 model call was never paid for twice."""
    settings = stack.settings.model_copy(update={"max_crashes": 2, "lease_seconds": 1.5})
    turn_id = start_turn("s-poison", stack.message, settings=settings)

    for _ in range(5):  # bounded: the turn must fail after max_crashes deaths
        worker = spawn(settings=settings, ready=False, CRASH_AT="1:before_run")
        wait_until(
            lambda: not worker.alive() or stack.store.get_turn(turn_id).finished,  # noqa: B023
            40,
            f"{worker.name} to crash or the turn to end\n{stack.report(turn_id)}",
        )
        if stack.store.get_turn(turn_id).finished:
            break
        assert stack.wait_exit(worker, 10) == 1, stack.report(turn_id)
        assert "CRASH_AT=1:before_run reached" in worker.log_text(), stack.report(turn_id)

    turn = stack.store.get_turn(turn_id)
    report = stack.report(turn_id)
    assert turn.status == "failed", report
    assert turn.error is not None and "died 2 times" in turn.error, report
    assert "MAX_CRASHES=2" in turn.error, report
    assert turn.crashes == 2 and len(stack.workers) == 3, report
    assert stack.workers[-1].alive(), f"the worker that gave up should not crash\n{report}"
    assert [(s.step, s.name, s.status) for s in stack.journal(turn_id)] == [
        (0, "llm", "done"),
        (1, "lookup_note", "intent"),
    ], report
    assert stack.model.request_count == 1, report
    assert stack.inbox.count == 0, report


def test_heartbeat_keeps_a_long_call_with_its_worker(stack: Stack, spawn: Spawn) -> None:
    """A model call of 5 s under a 1.5 s lease, with two workers running: the heartbeat
    keeps the claim, so the idle worker never takes the turn over (one attempt, epoch 1
    everywhere, no repeated request, one email)."""
    settings = stack.settings.model_copy(update={"lease_seconds": 1.5})
    spawn(settings=settings)
    spawn(settings=settings)
    stack.model.delay_seconds = 5.0
    stack.on_first_request(lambda: setattr(stack.model, "delay_seconds", 0.0))

    turn_id = start_turn("s-heartbeat", stack.message, settings=settings)
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert (turn.attempts, turn.crashes) == (1, 0), report
    steps = stack.journal(turn_id)
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert all(s.epoch == 1 for s in steps), report
    assert steps[0].finished_at is not None
    slow = (steps[0].finished_at - steps[0].created_at).total_seconds()
    assert slow >= 2 * settings.lease_seconds, f"step 0 took only {slow:.1f}s\n{report}"
    assert stack.model.request_count == 3 and stack.model.repeated_requests() == 0, report
    assert stack.subjects() == [stack.subject], report


def test_a_message_lost_from_redis_is_sent_again(
    stack: Stack, spawn: Spawn, redis_client: redis.Redis
) -> None:
    """The queue key is deleted after start_turn, before any worker saw the message: nothing
    is sent to or received from the queue for requeue_after (2 s), so the sweeper sends the
    oldest unreceived turn again as a probe."""
    settings = stack.settings.model_copy(update={"requeue_after_seconds": 2.0})
    turn_id = start_turn("s-lost", stack.message, settings=settings)
    assert redis_client.llen(settings.queue) == 1
    redis_client.delete(settings.queue)

    worker = spawn(settings=settings)
    turn = stack.wait_turn(turn_id, 30)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert f"sweeper enqueued {turn_id} (queue idle)" in worker.log_text(), report
    assert turn.attempts == 1, report
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert stack.subjects() == [stack.subject], report
    assert stack.model.request_count == 3 and stack.model.repeated_requests() == 0, report


def test_a_killed_prefork_child_is_replaced_at_once(stack: Stack, spawn: Spawn) -> None:
    """Celery's default pool: SIGKILL the child running a turn. Celery re-queues its message
    at once (reject on worker lost), a sibling sees that the claim's holder is gone from this
    machine and takes the turn without waiting for the lease; the other turns are unaffected."""
    worker = spawn(pool="prefork", concurrency=2)
    warm = [start_turn(f"s-warm{i}", stack.message, settings=stack.settings) for i in range(2)]
    for turn_id in warm:
        assert stack.wait_turn(turn_id, 30).status == "done", stack.report(turn_id)

    stack.model.reset_counts()  # the warm-up turns sent the same requests
    stack.model.hold()
    turn_id = start_turn("s-child", stack.message, settings=stack.settings)
    stack.model.wait_for_waiting(1, timeout=20)
    holder = stack.store.get_turn(turn_id).lease_owner or ""
    child = int(holder.split(":")[1])
    assert child != worker.pid, holder  # a child of the pool, not the worker's main process
    os.kill(child, signal.SIGKILL)
    killed_at = time.monotonic()
    stack.model.release()
    turn = stack.wait_turn(turn_id, 30)
    elapsed = time.monotonic() - killed_at

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert (turn.attempts, turn.crashes) == (2, 1), report
    assert elapsed < stack.settings.lease_seconds, f"took {elapsed:.1f}s\n{report}"
    assert worker.alive(), report
    assert stack.model.repeated_requests() == 1, report  # only the call the kill interrupted
    assert len(stack.inbox.messages) == 3, report


def test_a_worker_killed_between_receiving_and_claiming_is_not_waited_for(
    stack: Stack, spawn: Spawn
) -> None:
    """The worker notes the receipt of the message, then dies before it claims the turn
    (CRASH_AT=delivery:before_claim). Nothing in Postgres holds the turn, and Redis keeps the
    message unacknowledged for an hour; the sweeper of another worker on this machine sees
    that the receiver is gone and sends the turn again at once, not after requeue_after."""
    assert stack.settings.requeue_after_seconds >= 30
    first = spawn(CRASH_AT="delivery:before_claim")
    turn_id = start_turn("s-receiver", stack.message, settings=stack.settings)
    assert stack.wait_exit(first) == 1, stack.report(turn_id)
    died_at = time.monotonic()
    assert stack.store.get_turn(turn_id).received_by is not None, stack.report(turn_id)

    second = spawn()
    turn = stack.wait_turn(turn_id, 20)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert time.monotonic() - died_at < 15, report
    assert f"sweeper enqueued {turn_id} (receiver died)" in second.log_text(), report
    assert (turn.attempts, turn.crashes) == (1, 0), report


def test_a_backlog_on_one_worker_is_not_multiplied(stack: Stack, spawn: Spawn) -> None:
    """Forty turns queued at once on one worker, with requeue_after far shorter than the
    backlog lasts: every turn runs once and the sweeper sends none again (500 queued turns
    drew 538 re-sends when it re-sent every turn queued longer than requeue_after)."""
    settings = stack.settings.model_copy(update={"requeue_after_seconds": 1.0})
    stack.model.delay_seconds = 0.02  # the backlog lasts several times requeue_after
    turn_ids = [start_turn(f"s-backlog-{n}", stack.message, settings=settings) for n in range(40)]
    worker = spawn(settings=settings)
    for turn_id in turn_ids:
        assert stack.wait_turn(turn_id, 90).status == "done", stack.report(turn_id)

    log = worker.log_text()
    assert "sweeper enqueued" not in log, log
    assert log.count("Task durable_agent.run_turn[") >= 40
    assert "not run" not in log, log  # no duplicate delivery reached the claim
    assert len(stack.inbox.messages) == 40
