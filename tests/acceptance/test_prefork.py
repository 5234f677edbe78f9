"""Celery's default pool: children are forked from the worker's main process, where the
sweeper thread runs. Nothing that thread holds may cross a fork, and a slot whose child
died must take turns again."""

from __future__ import annotations

import os
import signal
import uuid
from typing import TYPE_CHECKING

import pytest

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


def test_one_armed_crash_is_one_crash_and_the_replacement_child_takes_turns(
    stack: Stack, spawn: Spawn
) -> None:
    """CRASH_AT=0:before_run (the first model call of every turn) with the prefork pool: the
    child that reaches it dies, and Celery forks a replacement while the sweeper (every 50 ms)
    uses the database in the main process. The replacement used to be armed again, so the
    turn crashed at every delivery until it failed for too many crashes; a crash point fires
    once per worker, so the first turn crashes once and then ends done, and four more turns
    run in the replacement child without a crash (a child forked while the sweeper held the
    database's lock used to wait on it forever)."""
    settings = stack.settings.model_copy(update={"sweep_interval_seconds": 0.05})
    worker = spawn(settings=settings, pool="prefork", concurrency=1, CRASH_AT="0:before_run")
    for n in range(5):
        turn_id = start_turn(f"s-fork-{n}", stack.message, settings=settings)
        turn = stack.wait_turn(turn_id, 40)
        assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
        assert turn.crashes == (1 if n == 0 else 0), stack.report(turn_id)
        assert len(stack.inbox.messages) == n + 1, stack.report(turn_id)
    assert worker.log_text().count("CRASH_AT=0:before_run reached") == 1, stack.logs()
    assert worker.alive(), stack.logs()


@pytest.mark.long
def test_twenty_killed_children_leave_every_slot_taking_turns(stack: Stack, spawn: Spawn) -> None:
    """SIGKILL a pool child twenty times, each time after Celery replaced the last one, with
    the sweeper running every 50 ms; then three turns held at the model at once show that
    all three slots take turns."""
    settings = stack.settings.model_copy(update={"sweep_interval_seconds": 0.05})
    worker = spawn(settings=settings, pool="prefork", concurrency=3)
    wait_until(lambda: len(worker.children()) == 3, 20, "three pool children")
    for kill in range(20):
        children = worker.children()
        os.kill(children[kill % len(children)], signal.SIGKILL)
        wait_until(
            lambda: len(worker.children()) == 3 and worker.children() != children,  # noqa: B023
            20,
            f"a replacement child after kill {kill + 1}",
        )
    assert worker.alive(), stack.logs()

    stack.model.hold()
    turn_ids = [
        start_turn(f"s-slot-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
        for _ in range(3)
    ]
    stack.model.wait_for_waiting(3, timeout=30)  # three turns in three children at once
    holders = {stack.store.get_turn(turn_id).lease_owner for turn_id in turn_ids}
    assert len(holders) == 3, holders
    stack.model.release()
    for turn_id in turn_ids:
        turn = stack.wait_turn(turn_id, 40)
        assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
    assert len(stack.inbox.messages) == 3
