"""Claims on a real Postgres: epochs, refusals, expiry and takeover, session order, races."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from durable_agent.journal import Claim, Database, JournalStore, Leases, Refusal
from durable_agent.settings import Settings

if TYPE_CHECKING:
    from conftest import DatabaseClock


def _claim(leases: Leases, turn_id: str, owner: str, lease: float = 30.0) -> Claim:
    claim = leases.claim(turn_id, owner, lease)
    assert isinstance(claim, Claim), claim
    return claim


def _take_over(leases: Leases, clock: DatabaseClock, turn_id: str, owner: str) -> Claim:
    """Refused while the current 30 s lease runs; claimed by `owner` once the database's
    clock has passed its end."""
    refusal = leases.claim(turn_id, owner, 30.0)
    assert isinstance(refusal, Refusal) and refusal.reason == "leased", refusal
    clock.advance(30.5)
    return _claim(leases, turn_id, owner)


def test_claim_moves_epoch_and_attempts_on(store: JournalStore, leases: Leases) -> None:
    """Each claim increments lease_epoch and attempts and marks the turn running."""
    turn = store.create_turn("s", "hi")

    first = _claim(leases, turn.turn_id, "a")
    assert (first.epoch, first.turn.attempts, first.turn.status) == (1, 1, "running")
    assert first.turn.lease_owner == "a" and first.turn.crashes == 0
    assert leases.release(turn.turn_id, first.epoch, 0.0, "try again")
    assert store.get_turn(turn.turn_id).status == "queued"

    second = _claim(leases, turn.turn_id, "a")
    assert (second.epoch, second.turn.attempts, second.turn.crashes) == (2, 2, 0)


def test_live_lease_refuses_another_owner(store: JournalStore, leases: Leases) -> None:
    """While the lease is live another owner is refused ("leased") with the time left."""
    turn = store.create_turn("s", "hi")
    held = _claim(leases, turn.turn_id, "a", lease=20.0)

    refusal = leases.claim(turn.turn_id, "b", 20.0)

    assert isinstance(refusal, Refusal)
    assert refusal.reason == "leased"
    assert "held by a" in refusal.detail and "for 20.0s more" in refusal.detail
    after = store.get_turn(turn.turn_id)
    assert (after.lease_owner, after.lease_epoch, after.attempts) == ("a", held.epoch, 1)


def test_expired_lease_is_taken_over_and_counts_a_crash(
    store: JournalStore, leases: Leases, clock: DatabaseClock
) -> None:
    """After the lease runs out another owner claims the turn; crashes becomes 1."""
    turn = store.create_turn("s", "hi")
    first = _claim(leases, turn.turn_id, "a")

    second = _take_over(leases, clock, turn.turn_id, "b")

    assert second.epoch == first.epoch + 1
    assert (second.turn.lease_owner, second.turn.crashes, second.turn.attempts) == ("b", 1, 2)


def test_later_turn_waits_for_the_earlier_one(store: JournalStore, leases: Leases) -> None:
    """A turn is refused ("waiting") until every earlier turn of its session has finished."""
    earlier = store.create_turn("s", "first")
    later = store.create_turn("s", "second")

    refusal = leases.claim(later.turn_id, "a", 30.0)
    assert isinstance(refusal, Refusal) and refusal.reason == "waiting"
    assert earlier.turn_id in refusal.detail

    claim = _claim(leases, earlier.turn_id, "a")
    refusal = leases.claim(later.turn_id, "b", 30.0)
    assert isinstance(refusal, Refusal) and refusal.reason == "waiting"

    ended = leases.finish(earlier.turn_id, claim.epoch, "done")
    assert ended is not None and ended.next_turn == ("s", later.turn_id, "")
    assert _claim(leases, later.turn_id, "b").epoch == 1


def test_renew_fails_after_takeover(
    store: JournalStore, leases: Leases, clock: DatabaseClock
) -> None:
    """The old owner's renew returns False once another owner took the turn over."""
    turn = store.create_turn("s", "hi")
    old = _claim(leases, turn.turn_id, "a")
    assert leases.renew(turn.turn_id, old.epoch, 30.0)

    new = _take_over(leases, clock, turn.turn_id, "b")

    assert leases.renew(turn.turn_id, old.epoch, 30.0) is False
    assert leases.renew(turn.turn_id, new.epoch, 30.0) is True
    assert leases.still_held(turn.turn_id, old.epoch) is False
    assert leases.still_held(turn.turn_id, new.epoch) is True


def test_stale_epoch_cannot_finish_fail_or_release(
    store: JournalStore, leases: Leases, clock: DatabaseClock
) -> None:
    """finish/fail/release with a stale epoch do nothing; the new owner's claim is intact."""
    turn = store.create_turn("s", "hi")
    old = _claim(leases, turn.turn_id, "a")
    new = _take_over(leases, clock, turn.turn_id, "b")

    assert leases.finish(turn.turn_id, old.epoch, "late reply") is None
    assert leases.fail(turn.turn_id, old.epoch, "late failure") is None
    assert leases.release(turn.turn_id, old.epoch, 0.0, "late release") is False

    now = store.get_turn(turn.turn_id)
    assert (now.status, now.lease_owner, now.lease_epoch) == ("running", "b", new.epoch)
    assert now.reply is None and now.error is None
    assert leases.finish(turn.turn_id, new.epoch, "reply") == ("s", 0, None, "done")
    done = store.get_turn(turn.turn_id)
    assert (done.status, done.reply, done.lease_owner) == ("done", "reply", None)

    refusal = leases.claim(turn.turn_id, "c", 30.0)
    assert isinstance(refusal, Refusal) and refusal.reason == "finished"


def test_claim_race_between_eight_threads_has_one_winner(
    settings: Settings, store: JournalStore
) -> None:
    """Eight owners claim at once on their own connections: exactly one gets the turn."""
    turn = store.create_turn("s", "contested")
    n = 8
    barrier = threading.Barrier(n)
    results: list[Claim | Refusal | BaseException] = []
    lock = threading.Lock()

    def contend(i: int) -> None:
        db = Database(settings.database_url)
        try:
            own = Leases(db)
            db.value("ping")  # connect before the race starts
            barrier.wait(timeout=30)
            result: Claim | Refusal | BaseException = own.claim(turn.turn_id, f"owner-{i}", 30.0)
        except BaseException as error:
            result = error
        finally:
            db.close()
        with lock:
            results.append(result)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(results) == n
    winners = [r for r in results if isinstance(r, Claim)]
    losers = [r for r in results if isinstance(r, Refusal)]
    assert len(winners) == 1, results
    assert len(losers) == n - 1, results
    assert all(r.reason == "leased" for r in losers)
    final = store.get_turn(turn.turn_id)
    assert (final.lease_epoch, final.attempts) == (1, 1)
    assert final.lease_owner == winners[0].owner
