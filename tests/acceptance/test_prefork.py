"""Celery's default pool: children are forked from the worker's main process, where the
sweeper thread runs. Nothing that thread holds may cross a fork, and a slot whose child
died must take turns again."""

from __future__ import annotations

import os
import signal
import uuid
from typing import TYPE_CHECKING

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


def test_every_replacement_child_takes_turns_after_a_sibling_died(
    stack: Stack, spawn: Spawn
) -> None:
    """Each new child dies right after its first send_email (CRASH_AT), so every turn forks
    a replacement while the sweeper (every 50 ms) uses the database in the main process. A
    child forked while the sweeper held the database's lock used to wait on it forever, and
    its slot never took work again; here five turns in a row each finish, one email each."""
    settings = stack.settings.model_copy(update={"sweep_interval_seconds": 0.05})
    worker = spawn(
        settings=settings, pool="prefork", concurrency=1, CRASH_AT="send_email:after_run"
    )
    for n in range(5):
        turn_id = start_turn(f"s-fork-{n}", stack.message, settings=settings)
        turn = stack.wait_turn(turn_id, 40)
        assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
        assert len(stack.inbox.messages) == n + 1, stack.report(turn_id)
    assert worker.log_text().count("CRASH_AT=send_email:after_run reached") == 5, stack.logs()
    assert worker.alive(), stack.logs()


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
