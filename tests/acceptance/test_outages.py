"""The broker and the database go away and come back: running turns are not cut, workers do
not exit, and an outage is not counted as a worker's death. Each test kills and restarts
its own throwaway Redis or Postgres, never the shared ones."""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

    from durable_agent.embedded import EmbeddedServices
    from durable_agent.testing.harness import WorkerProcess


def test_a_redis_restart_does_not_stop_a_prefork_worker(
    stack: Stack, spawn: Spawn, own_redis: EmbeddedServices
) -> None:
    """A prefork worker running fewer turns than its concurrency holds an unacknowledged
    message and a pending BRPOP; kombu 5.7 ended such a worker (exit 1, AttributeError in
    restore_unacked) when Redis restarted. Here it lives on: the running turn finishes, and
    a turn sent to the new Redis runs too."""
    settings = stack.settings.model_copy(update={"broker_url": own_redis.broker_url})
    worker = spawn(settings=settings, pool="prefork", concurrency=2)
    stack.model.hold()
    running = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    stack.model.wait_for_waiting(1, timeout=20)

    own_redis.restart_redis()
    stack.model.release()
    done = stack.wait_turn(running, 40)
    later = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    after = stack.wait_turn(later, 40)

    log = worker.log_text()
    assert done.status == "done" and after.status == "done", stack.report(running)
    assert worker.alive(), log
    assert "AttributeError" not in log and "Unrecoverable error" not in log, log
    assert len(stack.inbox.messages) == 2


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_broker_blip_does_not_cut_a_turn_inside_send_email(
    stack: Stack, spawn: Spawn, own_redis: EmbeddedServices, pool: str
) -> None:
    """Redis restarts while send_email is in the middle of its SMTP transaction. The turn
    is not terminated (which made the email 'may or may not have happened'): the send
    completes, is recorded as sent, and exactly one email arrives."""
    settings = stack.settings.model_copy(update={"broker_url": own_redis.broker_url})
    worker = spawn(settings=settings, pool=pool, concurrency=2)
    stack.inbox.hold()
    turn_id = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    stack.inbox.wait_for_waiting(1, timeout=30)

    own_redis.restart_redis()
    if pool == "prefork":  # the main process sees the loss while the child sends (a solo
        # worker runs the turn on the consumer's thread and sees it when the turn is over)
        wait_until(lambda: "Connection to broker lost" in worker.log_text(), 20, "the loss")
    stack.inbox.release()
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    send = stack.journal(turn_id)[3]
    assert send.name == "send_email" and not send.output.get("uncertain"), report
    assert send.output["content"].startswith("Sent"), report
    assert stack.subjects() == [stack.subject], report
    assert (turn.attempts, turn.crashes) == (1, 0), report
    assert worker.alive(), report


@pytest.mark.long
def test_a_postgres_outage_is_waited_out_and_counts_no_crash(
    stack: Stack, spawn: Spawn, own_postgres: EmbeddedServices
) -> None:
    """Postgres is killed while three turns are inside model calls on a solo and a prefork
    worker, and stays down for over two leases. The workers wait for it (one log line as
    the outage starts, none per delivery, no traceback), then finish every turn; no turn
    counts a crash, since no worker died."""
    settings = stack.settings.model_copy(update={"database_url": own_postgres.database_url})
    solo = spawn(settings=settings)
    prefork = spawn(settings=settings, pool="prefork", concurrency=2)
    stack.model.hold()
    turn_ids = [
        start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings) for _ in range(3)
    ]
    stack.model.wait_for_waiting(3, timeout=30)

    own_postgres.restart_postgres(kill=True, downtime=2.5 * settings.lease_seconds)
    stack.model.release()

    from durable_agent.runtime import runtime_for

    runtime = runtime_for(settings)
    for turn_id in turn_ids:
        turn = runtime.wait_for_turn(turn_id, 60)
        assert turn.status == "done" and turn.reply == stack.clean_reply, stack.logs()
        assert turn.crashes == 0, (turn, stack.logs())
    assert len(stack.inbox.messages) == 3

    def outage_ended(worker: WorkerProcess) -> bool:
        log = worker.log_text()
        return log.count("Postgres is reachable again") == log.count("Postgres is unreachable")

    for worker in (solo, prefork):
        # each process that saw the outage logs its end (the main process at its next sweep)
        wait_until(lambda: outage_ended(worker), 10, "the end of the outage in the log")  # noqa: B023
        log = worker.log_text()
        assert worker.alive(), log
        assert "Traceback" not in log, log
        processes = 1 if worker is solo else 3  # main (sweeper) + two children
        assert 1 <= log.count("Postgres is unreachable") <= processes, log


def test_a_postgres_crash_that_loses_the_last_writes_runs_them_again(
    stack: Stack, spawn: Spawn, own_postgres: EmbeddedServices
) -> None:
    """Model steps are committed without waiting for the WAL flush, so a Postgres crash can
    take the newest of them away. The WAL writer is slowed to 10 s and Postgres is SIGKILLed
    while step 0's model call is in flight, so its intent is gone when the worker,
    reconnected, records the outcome. The worker refuses to build on the missing step,
    starts the turn again from what survived (nothing), and finishes it: one repeated model
    call, one email, a clean journal, no crash counted.

    Postgres writes its WAL out early when a record completes a WAL page, and then the
    intent survives the kill; so the scenario is tried with up to three turns, each held to
    every guarantee, until one of them has lost its step."""
    import psycopg

    from durable_agent.runtime import runtime_for

    with psycopg.connect(own_postgres.database_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
    settings = stack.settings.model_copy(update={"database_url": own_postgres.database_url})
    worker = spawn(settings=settings)
    runtime = runtime_for(settings)
    for attempt in range(1, 4):
        lost_before = worker.log_text().count("the journal lost its last writes")
        stack.model.reset_counts()  # each turn sends the same requests: count per attempt
        stack.inbox.clear()
        stack.model.hold()
        turn_id = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
        stack.model.wait_for_waiting(1, timeout=30)  # step 0's intent: committed, not flushed

        own_postgres.restart_postgres(kill=True)
        stack.model.release()

        turn = runtime.wait_for_turn(turn_id, 60)
        log = worker.log_text()
        assert turn.status == "done" and turn.reply == stack.clean_reply, log
        assert turn.crashes == 0, (turn, log)
        assert stack.subjects() == [stack.subject], log
        steps = runtime.journal.load_journal(turn_id)
        assert [(s.step, s.kind, s.name, s.replay) for s in steps] == stack.clean_steps, log
        assert all(s.status == "done" for s in steps), log
        assert worker.alive() and "Traceback" not in log, log
        lost = log.count("the journal lost its last writes") > lost_before
        # step 0 ran again only if it was lost, and nothing else ever runs again
        assert stack.model.repeated_requests() == int(lost), log
        if lost:
            break
        print(f"attempt {attempt}: the intent reached the disk before the kill; again")
    else:
        raise AssertionError(f"three crashes lost no step: {worker.log_text()}")


def test_a_turn_that_ends_while_redis_is_down_costs_one_line_not_a_traceback(
    stack: Stack, spawn: Spawn, own_redis: EmbeddedServices
) -> None:
    """A turn ends while Redis is down: its late ack cannot reach Redis. A solo worker runs
    the turn on its consumer's thread, so nothing noticed the loss before the ack (a prefork
    worker can get there too, with a child's result), and Celery logged CRITICAL "Couldn't
    ack" with a traceback. The turn is done in Postgres and a copy of the message that comes
    back is refused by the claim: one warning line."""
    url = own_redis.broker_url
    settings = stack.settings.model_copy(update={"broker_url": url})
    worker = spawn(settings=settings)
    stack.model.hold()
    turn_id = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    stack.model.wait_for_waiting(1, timeout=30)

    restart = threading.Thread(target=lambda: own_redis.restart_redis(downtime=4.0))
    restart.start()
    try:  # the turn goes on, and ends, while Redis is down
        wait_until(lambda: not _answers(url), 10, "Redis to be down")
        stack.model.release()
        turn = stack.wait_turn(turn_id, 60)
        wait_until(lambda: "ack" in worker.log_text().split("succeeded in")[-1], 20, "the ack")
    finally:
        restart.join(timeout=30)

    log = worker.log_text()
    assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
    assert "Couldn't ack" not in log and "Traceback" not in log, log
    assert len([line for line in log.splitlines() if "could not acknowledge" in line]) == 1, log
    assert worker.alive(), log


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@pytest.mark.long
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_never_call_that_ran_through_a_postgres_outage_keeps_its_outcome(
    stack: Stack, spawn: Spawn, own_postgres: EmbeddedServices, pool: str
) -> None:
    """Postgres is killed while send_email is inside its SMTP transaction and stays down for
    over two leases; the email goes out while it is down. The worker holds the result, and
    writes it when Postgres is back (its epoch is still the turn's): the turn ends done, the
    tool ran once, the model never reads "may or may not have happened", and the inbox of
    uncertain effects stays empty. Before, the delivery started over from the journal and the
    known outcome became uncertain."""
    import threading

    import psycopg

    from durable_agent import list_uncertain
    from durable_agent.runtime import runtime_for

    url = own_postgres.database_url
    settings = stack.settings.model_copy(update={"database_url": url})
    worker = spawn(settings=settings, pool=pool)
    stack.inbox.hold()
    turn_id = start_turn(f"s-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    stack.inbox.wait_for_waiting(1, timeout=30)

    outage = threading.Thread(
        target=own_postgres.restart_postgres,
        kwargs={"kill": True, "downtime": 2.5 * settings.lease_seconds},
    )
    outage.start()
    try:

        def postgres_down() -> bool:
            try:
                psycopg.connect(url, connect_timeout=1).close()
            except psycopg.OperationalError:
                return True
            return False

        wait_until(postgres_down, 20, "Postgres down")
        stack.inbox.release()  # the email goes out while Postgres is down
        wait_until(lambda: len(stack.inbox.messages) == 1, 20, "the email")
    finally:
        outage.join(timeout=60)
    runtime = runtime_for(settings)
    turn = runtime.wait_for_turn(turn_id, 60)

    report = stack.report(turn_id)
    log = worker.log_text()
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert stack.subjects() == [stack.subject], report
    steps = runtime.journal.load_journal(turn_id)
    assert [(s.step, s.kind, s.name, s.replay) for s in steps] == stack.clean_steps, report
    send = steps[3]
    assert send.status == "done" and not send.output.get("uncertain"), report
    assert send.output["content"].startswith("Sent"), report
    assert all("may or may not" not in str(s.output) for s in steps), report
    assert list_uncertain(include_resolved=True, settings=settings) == [], report
    assert turn.crashes == 0, report
    # The worker saw the outage. Whether the write of step 3's outcome itself met it (and
    # logged "keeping the outcome of step 3 until Postgres is back") depends on timing under
    # load (CI once saw the write land just after Postgres was back); the outcome kept is
    # what matters, and is asserted above.
    assert "Postgres is unreachable" in log, log
    assert worker.alive() and "Traceback" not in log, log
