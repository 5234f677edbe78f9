"""A claim whose holder died on this machine ends at once; others wait for their lease."""

from __future__ import annotations

import socket
import subprocess
import sys

import psycopg
import pytest
import redis

from durable_agent.journal import Claim, Database, JournalStore, Leases, Refusal
from durable_agent.journal.holders import host_token
from durable_agent.runtime import Runtime
from durable_agent.testing.harness import forget_queue

pytestmark = pytest.mark.skipif(host_token() is None, reason="needs /proc")


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def local_owner(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:1#{host_token()}"


def test_claim_ends_the_claim_of_a_dead_local_holder(store: JournalStore, leases: Leases) -> None:
    turn = store.create_turn("s", "hello")
    dead = local_owner(dead_pid())
    first = leases.claim(turn.turn_id, dead, 60)
    assert isinstance(first, Claim)

    second = leases.claim(turn.turn_id, "survivor", 60)

    assert isinstance(second, Claim), second
    assert second.epoch == first.epoch + 1
    assert second.turn.crashes == 1  # the dead holder never released it


def test_claims_of_live_or_foreign_holders_wait_for_their_lease(
    store: JournalStore, leases: Leases
) -> None:
    for owner in (local_owner(dead_pid()).replace(host_token() or "", "0123456789ab"), "b"):
        turn = store.create_turn(f"s-{owner}", "hello")
        assert isinstance(leases.claim(turn.turn_id, owner, 60), Claim)
        refusal = leases.claim(turn.turn_id, "survivor", 60)
        assert isinstance(refusal, Refusal) and refusal.reason == "leased", refusal


def test_the_fast_path_can_be_switched_off(db: Database, store: JournalStore) -> None:
    leases = Leases(db, end_dead_local_claims=False)
    turn = store.create_turn("s", "hello")
    assert isinstance(leases.claim(turn.turn_id, local_owner(dead_pid()), 60), Claim)
    refusal = leases.claim(turn.turn_id, "survivor", 60)
    assert isinstance(refusal, Refusal) and refusal.reason == "leased"


def test_sweeper_resends_a_turn_whose_local_holder_died(
    runtime: Runtime, pg: psycopg.Connection, store: JournalStore, leases: Leases
) -> None:
    """Without waiting for the 60 s lease: the next sweep pass ends the claim and sends it."""
    turn = store.create_turn("s", "hello")
    store.mark_sent([turn.turn_id], ["message-1"])
    assert isinstance(leases.claim(turn.turn_id, local_owner(dead_pid()), 60), Claim)

    sent = runtime.sweeper().sweep_once()
    settings = runtime.settings

    assert sent == [("s", turn.turn_id, "claim expired")]
    expired = pg.execute(
        "SELECT lease_expires_at <= now() FROM turns WHERE turn_id = %(t)s",
        {"t": turn.turn_id},
    ).fetchone()[0]
    assert expired is True
    client = redis.Redis.from_url(settings.broker_url)
    forget_queue(client, settings.queue)
    client.close()
