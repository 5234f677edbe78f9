"""Many workers share the work: three prefork workers, sixty turns."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from durable_agent import start_turn

if TYPE_CHECKING:
    from conftest import Spawn, Stack

WORKERS, CONCURRENCY, TURNS = 3, 2, 60


@pytest.mark.long
def test_three_prefork_workers_share_sixty_turns(stack: Stack, spawn: Spawn) -> None:
    """Every turn is done once, each of the three workers takes a fair share, and no turn
    waits in the queue while a slot is free (sampled all along the run)."""
    stack.model.delay_seconds = 0.05  # each model call takes a little time, as a real one
    workers = [spawn(pool="prefork", concurrency=CONCURRENCY) for _ in range(WORKERS)]
    slots = WORKERS * CONCURRENCY
    samples: list[tuple[float, int, int]] = []  # (when, running, waiting) while turns remain
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            turns = stack.store.list_turns(limit=TURNS)
            running = sum(t.status == "running" for t in turns)
            waiting = sum(t.status == "queued" for t in turns)
            if running + waiting:
                samples.append((time.monotonic(), running, waiting))
            time.sleep(0.05)

    turn_ids = [
        start_turn(f"s-many-{uuid.uuid4().hex[:6]}", stack.message, settings=stack.settings)
        for _ in range(TURNS)
    ]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        turns = [stack.wait_turn(turn_id, 120) for turn_id in turn_ids]
    finally:
        done.set()
        sampler.join(timeout=5)

    assert all(t.status == "done" and t.reply == stack.clean_reply for t in turns), stack.logs()
    assert all((t.attempts, t.crashes) == (1, 0) for t in turns)
    assert len(stack.inbox.messages) == TURNS  # one email each: nothing ran twice
    split = Counter(
        {
            w.name: len(
                re.findall(r"Task durable_agent\.run_turn\[[^]]+\] succeeded", w.log_text())
            )
            for w in workers
        }
    )
    print(f"\nturns per worker: {dict(split)}")
    assert sum(split.values()) == TURNS, split
    assert min(split.values()) >= TURNS // (2 * WORKERS), split  # none far below its share
    # A turn waiting while slots are free. A slot between two turns is free for a moment, and
    # longer when the machine is busy; a turn held back behind another (prefetch) waits for
    # whole turns, seconds. So: no stretch of that state may last a second.
    assert longest_idle_with_work(samples, slots) < 1.0, samples


def longest_idle_with_work(samples: list[tuple[float, int, int]], slots: int) -> float:
    """The longest time, in seconds, during which turns waited while two or more slots were free."""
    longest, since = 0.0, None
    for when, running, waiting in samples:
        if waiting and running < slots - 1:
            since = when if since is None else since
            longest = max(longest, when - since)
        else:
            since = None
    return longest
