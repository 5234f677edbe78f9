"""The uncertain-effects hooks: each told of each effect once whatever the other does, a
hung one bounded and holding no lock or transaction, and a stable notice_id to deduplicate
the at-least-once pages with."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pagers
import pytest
import redis

from durable_agent.journal import JournalStore, Leases
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing.harness import forget_queue, wait_until

if TYPE_CHECKING:
    from conftest import DatabaseClock


def _uncertain_effect(store: JournalStore, leases: Leases, session: str) -> str:
    """A done turn whose never call at step 1 was interrupted (recorded uncertain)."""
    turn = store.create_turn(session, "refund order 7")
    claim = leases.claim(turn.turn_id, "w", 30.0)
    store.insert_done(turn.turn_id, claim.epoch, 0, "model", "llm", {}, "safe", {"message": {}})
    store.insert_intent(
        turn.turn_id,
        claim.epoch,
        1,
        "tool",
        "refund",
        {"arguments": {"order": 7}, "idempotency_key": f"{turn.turn_id}:1"},
        "never",
    )
    store.record_outcome(turn.turn_id, claim.epoch, 1, {"content": "?", "uncertain": True})
    assert leases.finish(turn.turn_id, claim.epoch, "ok") is not None
    return turn.turn_id


@pytest.fixture
def pager_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pager.jsonl"
    monkeypatch.setenv("PAGER_FILE", str(path))
    return path


@pytest.fixture(autouse=True)
def _fresh_pagers() -> Iterator[None]:
    pagers.calls.clear()
    pagers.release.clear()
    yield
    pagers.release.set()  # a hung call ends with the test


def _paged(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["notice_id"] for line in path.read_text().splitlines()]


def _sweep(settings: Settings, **update: Any) -> None:
    runtime = Runtime(settings.model_copy(update=update))
    try:
        runtime.sweeper().sweep_once()
    finally:
        runtime.close()


def test_each_hook_is_told_once_whatever_the_other_does(
    settings: Settings,
    store: JournalStore,
    leases: Leases,
    redis_client: redis.Redis,
) -> None:
    """The callback raises at the first pass and the Celery task is sent: the second pass
    asks the callback again and does not send the task again (it was sent twice before).
    Both carry the effect's notice_id."""
    turn_id = _uncertain_effect(store, leases, "s-page")
    queue = f"{settings.queue}-pager"
    hooked = {
        "uncertain_callback": "pagers:fail_once",
        "uncertain_task": "myapp.page_oncall",
        "uncertain_queue": queue,
    }
    try:
        for _ in range(3):
            _sweep(settings, **hooked)
        sent = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
    finally:
        forget_queue(redis_client, queue)
    assert pagers.calls == [f"{turn_id}:1", f"{turn_id}:1"]  # raised, then told
    assert len(sent) == 1, sent
    [args] = json.loads(base64.b64decode(sent[0]["body"]))[0]
    assert args["notice_id"] == f"{turn_id}:1" and args["step"] == 1


def test_a_hung_hook_is_bounded_and_holds_up_no_other_worker(
    settings: Settings,
    store: JournalStore,
    leases: Leases,
    pager_file: Path,
    clock: DatabaseClock,
    pg: Any,
) -> None:
    """Worker A's callback never returns. A's pass gives up on it after the timeout, with no
    transaction open and no lock held while it hangs; worker B (a working pager) then pages
    the effect A did not reach at once, and the one A hung on when A's claim runs out; each
    once."""
    first = _uncertain_effect(store, leases, "s-one")
    second = _uncertain_effect(store, leases, "s-two")
    hung = threading.Thread(
        target=_sweep,
        args=(settings,),
        kwargs={"uncertain_callback": "pagers:hang", "uncertain_hook_timeout_seconds": 0.5},
        daemon=True,
    )
    hung.start()
    wait_until(lambda: pagers.calls == [f"{first}:1"], 10, "A's hook called")
    idle = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%'"
    ).fetchone()[0]
    advisory = pg.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()[0]
    assert (idle, advisory) == (0, 0)
    hung.join(timeout=10)
    assert not hung.is_alive(), "A's pass is still waiting for its hung hook"

    paging = {"uncertain_callback": "durable_agent_examples.pager:page"}
    _sweep(settings, **paging)
    assert _paged(pager_file) == [f"{second}:1"]
    clock.advance(60)  # longer than A's claim on what its hung hook was given
    _sweep(settings, **paging)
    _sweep(settings, **paging)
    assert sorted(_paged(pager_file)) == sorted([f"{first}:1", f"{second}:1"])
    assert pagers.calls == [f"{first}:1"]  # A's process did not call its hung hook again
