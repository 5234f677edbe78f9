"""send_event and approve/deny in the application's own transaction, on real prefork workers:
for each kind of connection (a SQLAlchemy Session, a SQLAlchemy Core Connection, a psycopg 3
connection) a rolled-back send (or decision) leaves nothing and the turn stays parked, one
inside a rolled-back savepoint likewise, and a committed one wakes the turn, which runs once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from durable_agent_examples.waiting_agents_policy import waits_policy
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from durable_agent import approve, audit_trail, deny, list_approvals, send_event, start_turn
from durable_agent.journal import WaitStore
from durable_agent.settings import Settings
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

KINDS = ["session", "core", "psycopg"]
APPROVAL = {"DURABLE_AGENT_APPROVAL_REQUIRED": "send_email"}


@dataclass
class App:
    """One transaction of the application on a connection of ``kind``."""

    connection: Any
    execute: Callable[[str, dict[str, Any]], None]
    commit: Callable[[], None]
    rollback: Callable[[], None]
    savepoint: Callable[[], AbstractContextManager[None]]  # rolled back at its end


@contextmanager
def _app(kind: str, settings: Settings) -> Iterator[App]:
    if kind == "psycopg":
        with psycopg.connect(settings.database_url) as conn:

            @contextmanager
            def raw_savepoint() -> Iterator[None]:
                conn.execute("SAVEPOINT app")
                yield
                conn.execute("ROLLBACK TO SAVEPOINT app")

            yield App(
                conn,
                lambda sql, params: conn.execute(sql.replace(":ref", "%(ref)s"), params) and None,
                conn.commit,
                conn.rollback,
                raw_savepoint,
            )
        return
    url = settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    try:
        owner: Any = Session(engine) if kind == "session" else engine.connect()
        with owner:

            @contextmanager
            def nested() -> Iterator[None]:
                savepoint = owner.begin_nested()
                yield
                savepoint.rollback()

            yield App(
                owner,
                lambda sql, params: owner.execute(text(sql), params) and None,
                owner.commit,
                owner.rollback,
                nested,
            )
    finally:
        engine.dispose()


def _paid(settings: Settings) -> list[str]:
    with psycopg.connect(settings.database_url) as conn:
        return [r[0] for r in conn.execute("SELECT ref FROM payments ORDER BY ref")]


def _make_payments(settings: Settings) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS payments (ref text PRIMARY KEY)")


def _status(settings: Settings, stack: Stack, turn_id: str) -> str:
    return stack.store.get_turn(turn_id).status


@pytest.mark.parametrize("kind", KINDS)
def test_an_event_sent_in_the_application_transaction_wakes_the_turn_after_the_commit(
    stack: Stack, spawn: Spawn, kind: str
) -> None:
    """The checkout waits for payment_settled. A send rolled back, and one in a rolled-back
    savepoint, leave no event and the turn parked; a committed one wakes it once: one
    receipt, the event read once."""
    stack.model.policy = waits_policy
    settings = stack.settings.model_copy(
        update={"agents": "durable_agent_examples.waiting_agents", "sweep_interval_seconds": 0.2}
    )
    spawn(
        settings=settings,
        pool="prefork",
        concurrency=1,
        DURABLE_AGENT_AGENTS="durable_agent_examples.waiting_agents",
    )
    _make_payments(settings)
    turn_id = start_turn(f"s-{kind}", "order 7", agent="checkout", settings=settings)
    wait_until(lambda: _status(settings, stack, turn_id) == "waiting", 20, "the checkout to park")
    waits = WaitStore(stack.store.db)
    pay = "INSERT INTO payments (ref) VALUES (:ref)"

    def settle(app: App, ref: str) -> Any:
        return send_event(
            turn_id,
            "payment_settled",
            {"payment_id": ref},
            event_id=ref,
            settings=settings,
            connection=app.connection,
        )

    with _app(kind, settings) as app:
        app.execute(pay, {"ref": "p1"})
        sent = settle(app, "p1")
        assert (sent.outcome, sent.on_commit) == ("woke", True)
        assert "wakes when it commits" in sent.describe()
        app.rollback()
        assert waits.events(turn_id) == [] and _paid(settings) == []
        assert _status(settings, stack, turn_id) == "waiting"
        assert waits.waits([turn_id])[turn_id].name == "payment_settled"

        app.execute(pay, {"ref": "p2"})
        with app.savepoint():
            assert settle(app, "p2").outcome == "woke"
        app.commit()
        assert _paid(settings) == ["p2"] and waits.events(turn_id) == []
        assert _status(settings, stack, turn_id) == "waiting"

        app.execute(pay, {"ref": "p3"})
        assert settle(app, "p3").outcome == "woke"
        assert settle(app, "p3").outcome == "duplicate"  # the same id again: nothing more
        # nothing of it is visible outside the transaction before the commit
        assert waits.events(turn_id) == [] and _status(settings, stack, turn_id) == "waiting"
        app.commit()
    turn = stack.wait_turn(turn_id, 30)
    report = stack.report(turn_id)
    assert (turn.status, turn.reply) == (
        "done",
        "Payment p3 settled; the receipt went to ada@example.com.",
    ), report
    assert _paid(settings) == ["p2", "p3"]
    assert [(e.event_id, e.consumed_step) for e in waits.events(turn_id)] == [("p3", 0)]
    assert stack.subjects() == ["Receipt"], report
    assert [(s.step, s.kind, s.name) for s in stack.journal(turn_id)] == [
        (0, "wait", "event:payment_settled"),
        (1, "tool", "send_email"),
    ], report
    again = send_event(turn_id, "payment_settled", {}, event_id="p3", settings=settings)
    assert again.outcome == "duplicate"


@pytest.mark.parametrize("kind", KINDS)
def test_an_approval_in_the_application_transaction_sends_the_turn_after_the_commit(
    stack: Stack, spawn: Spawn, kind: str
) -> None:
    """send_email needs approval. An approve rolled back, and a deny in a rolled-back
    savepoint, leave the call undecided, no audit entry and the turn parked; a committed
    approve sends the turn on: one email, one audit entry (interface python)."""
    spawn(pool="prefork", concurrency=1, **APPROVAL)
    _make_payments(stack.settings)
    turn_id = start_turn(f"s-approve-{kind}", stack.message, settings=stack.settings)
    wait_until(
        lambda: _status(stack.settings, stack, turn_id) == "waiting",
        30,
        f"the turn to park\n{stack.logs()}",
    )
    settings = stack.settings

    def pending() -> list[tuple[int, str | None]]:
        listed = list_approvals(turn_id=turn_id, include_decided=True, settings=settings)
        return [(a.step, a.decision) for a in listed]

    def decisions() -> list[tuple[str, str, str]]:
        trail = audit_trail(turn_id=turn_id, settings=settings)
        return [(e.action, e.actor, e.interface) for e in trail]

    with _app(kind, settings) as app:
        approved = approve(turn_id, 3, by="ada", settings=settings, connection=app.connection)
        assert (approved.decision, approved.decided_by) == ("approved", "ada")
        app.rollback()
        assert pending() == [(3, None)] and decisions() == []
        assert _status(settings, stack, turn_id) == "waiting"

        app.execute("INSERT INTO payments (ref) VALUES (:ref)", {"ref": "kept"})
        with app.savepoint():
            deny(turn_id, 3, "not now", by="bob", settings=settings, connection=app.connection)
        app.commit()
        assert _paid(settings) == ["kept"]
        assert pending() == [(3, None)] and decisions() == []
        assert _status(settings, stack, turn_id) == "waiting"

        approve(turn_id, 3, by="ada", settings=settings, connection=app.connection)
        assert pending() == [(3, None)]  # not visible before the commit
        app.commit()
    turn = stack.wait_turn(turn_id, 30)
    report = stack.report(turn_id)
    assert (turn.status, turn.reply) == ("done", stack.clean_reply), report
    assert stack.subjects() == [stack.subject], report
    assert pending() == [(3, "approved")]
    assert decisions() == [("approve", "ada", "python")]
    assert stack.journal(turn_id)[3].input["approval"]["decided_by"] == "ada", report
    assert stack.model.repeated_requests() == 0, report
