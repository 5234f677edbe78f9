"""Many workers share the work: three prefork workers, sixty turns."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

from durable_agent import start_turn

if TYPE_CHECKING:
    from conftest import Spawn, Stack

WORKERS, CONCURRENCY, TURNS = 3, 2, 60


def test_three_prefork_workers_share_sixty_turns(stack: Stack, spawn: Spawn) -> None:
    """Every turn is done once, each of the three workers takes a fair share, and no turn
    waits in the queue while a slot is free (sampled all along the run)."""
    stack.model.delay_seconds = 0.05  # each model call takes a little time, as a real one
    workers = [spawn(pool="prefork", concurrency=CONCURRENCY) for _ in range(WORKERS)]
    slots = WORKERS * CONCURRENCY
    samples: list[tuple[int, int]] = []  # (running, waiting) while turns remain
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            turns = stack.store.list_turns(limit=TURNS)
            running = sum(t.status == "running" for t in turns)
            waiting = sum(t.status == "queued" for t in turns)
            if running + waiting:
                samples.append((running, waiting))
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
    # a turn waiting while a slot is free: allow the moments a slot is between two turns
    idle_with_work = [s for s in samples if s[1] > 0 and s[0] < slots - 1]
    assert len(idle_with_work) <= max(2, len(samples) // 10), (idle_with_work, len(samples))
