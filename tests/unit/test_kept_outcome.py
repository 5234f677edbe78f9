"""The outcome of a never call that ran is kept through a Postgres outage and written when
Postgres is back, the fence deciding (ClaimedJournal over a store that fails on cue)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from durable_agent.errors import LeaseLost, ServiceUnavailable
from durable_agent.journal.records import EncodedOutcome, Step
from durable_agent.journal.store import ClaimedJournal, JournalStore
from durable_agent.testing import make_step


class FlakyStore:
    """Fails the outcome writes as scripted: 'down' (ServiceUnavailable), 'committed' (the
    write lands, then the connection breaks), 'lost' (the fence refuses it), 'ok'."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.written: list[tuple[int, int]] = []  # (step, epoch) that landed

    def insert_intent(self, *args: Any, **kwargs: Any) -> None:
        pass

    def encode_outcome(self, turn_id: str, step: int, output: Any) -> EncodedOutcome:
        return EncodedOutcome(step, output, None)

    def write_outcome(self, turn_id: str, epoch: int, outcome: EncodedOutcome, **_: Any) -> None:
        what = self.script.pop(0)
        if what == "down":
            raise ServiceUnavailable("cannot reach Postgres")
        if what == "committed":
            self.written.append((outcome.step, epoch))
            raise ServiceUnavailable("the connection broke after the commit")
        if what == "lost" or (outcome.step, epoch) in self.written:
            raise LeaseLost(f"turn {turn_id}: outcome of step {outcome.step} rejected")
        self.written.append((outcome.step, epoch))

    def load_journal_from(self, turn_id: str, first: int) -> list[Step]:
        return [
            make_step(step, "tool", "send_email", {}, "never", "done", {}, epoch=epoch)
            for step, epoch in self.written
            if step >= first
        ]


def _journal(store: FlakyStore, waits: list[str]) -> ClaimedJournal:
    journal = ClaimedJournal(
        cast(JournalStore, store), "t1", 2, [], wait_for_postgres=lambda e: waits.append(str(e))
    )
    journal.insert_intent(3, "tool", "send_email", {"arguments": {}}, "never")
    return journal


def test_the_outcome_is_written_once_postgres_answers() -> None:
    store, waits = FlakyStore(["down", "down", "ok"]), []
    _journal(store, waits).record_outcome(3, {"content": "Sent"})
    assert store.written == [(3, 2)] and len(waits) == 2


def test_a_write_that_committed_before_the_connection_broke_is_this_claims_own() -> None:
    store, waits = FlakyStore(["committed", "ok"]), []
    _journal(store, waits).record_outcome(3, {"content": "Sent"})
    assert store.written == [(3, 2)] and len(waits) == 1


def test_the_fence_decides_a_claim_taken_over_meanwhile_writes_nothing() -> None:
    store, waits = FlakyStore(["down", "lost"]), []
    with pytest.raises(LeaseLost):
        _journal(store, waits).record_outcome(3, {"content": "Sent"})
    assert store.written == []


def test_without_a_wait_the_outage_ends_the_delivery() -> None:
    store = FlakyStore(["down"])
    journal = ClaimedJournal(cast(JournalStore, store), "t1", 2, [])
    journal.insert_intent(3, "tool", "send_email", {"arguments": {}}, "never")
    with pytest.raises(ServiceUnavailable):
        journal.record_outcome(3, {"content": "Sent"})
