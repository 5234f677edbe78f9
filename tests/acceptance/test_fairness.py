"""Fairness with real prefork workers: a concurrency key per turn (the tenant), at most 2 of
one key running at once on 4 slots. A tenant's burst queued first does not starve the other
tenant, the burst's turns start in the order they were recorded, and every turn is done."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from durable_agent.runtime import Runtime
from durable_agent.testing import reply

if TYPE_CHECKING:
    from conftest import Spawn, Stack

BURST = 16


class Tenants:
    """A model that answers after 0.3 s and notes which tenant's turn asked, and how many of
    each tenant's turns were in a model call at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[str] = []  # the user message of each request, as they arrive
        self.busy: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        message = str(body["messages"][-1]["content"])
        tenant = message.split()[0]
        with self.lock:
            self.order.append(message)
            self.busy[tenant] = self.busy.get(tenant, 0) + 1
            self.most[tenant] = max(self.most.get(tenant, 0), self.busy[tenant])
        time.sleep(0.3)
        with self.lock:
            self.busy[tenant] -= 1
        return reply(f"done {message}")


def test_a_burst_of_one_tenant_does_not_starve_another(stack: Stack, spawn: Spawn) -> None:
    tenants = Tenants()
    stack.model.policy = tenants
    settings = stack.settings.model_copy(update={"concurrency_per_key": 2, "system_prompt": ""})
    runtime = Runtime(settings)
    try:
        spawn(settings=settings, pool="prefork", concurrency=4)
        a = [
            runtime.start_turn(f"a-{i}", f"acme {i:02d}", concurrency_key="acme")
            for i in range(BURST)
        ]
        b = [
            runtime.start_turn(f"b-{i}", f"bolt {i:02d}", concurrency_key="bolt") for i in range(3)
        ]
        turns = [stack.wait_turn(t, timeout=90) for t in a + b]
    finally:
        runtime.close()
    report = stack.report()
    assert [t.status for t in turns] == ["done"] * (BURST + 3), report
    assert tenants.most == {"acme": 2, "bolt": 2}, (tenants.most, report)
    order = tenants.order
    acme = [m for m in order if m.startswith("acme")]
    # in the order recorded, up to the two that run at once: a turn is sent only when one
    # of the two before it has ended (which two prefork children call the model first races)
    assert sorted(acme) == [f"acme {i:02d}" for i in range(BURST)], order
    seen = {m: n for n, m in enumerate(acme)}
    assert all(seen[f"acme {i:02d}"] < seen[f"acme {i + 2:02d}"] for i in range(BURST - 2)), order
    first_bolt = next(i for i, m in enumerate(order) if m.startswith("bolt"))
    assert first_bolt <= 3, order  # beside the first two of acme's, not after its burst
    last_bolt = max(i for i, m in enumerate(order) if m.startswith("bolt"))
    assert last_bolt < BURST // 2, order


def test_agent_turn_delay_takes_a_concurrency_key(stack: Stack, spawn: Spawn) -> None:
    """``agent_turn.delay(..., concurrency_key=...)``: the worker records the turn with its
    key, and the limit holds for it as for ``start_turn``'s."""
    import psycopg

    from durable_agent.delivery.task_names import AGENT_TURN
    from durable_agent.runtime import runtime_for

    stack.model.policy = Tenants()
    settings = stack.settings.model_copy(update={"concurrency_per_key": 1, "system_prompt": ""})
    spawn(settings=settings, pool="prefork", concurrency=2)
    agent_turn = runtime_for(settings).celery.tasks[AGENT_TURN]
    results = [
        agent_turn.delay(f"d-{i}", f"acme {i:02d}", concurrency_key="acme") for i in range(3)
    ]
    turns = [stack.wait_turn(r.id, timeout=60) for r in results]
    assert [t.status for t in turns] == ["done"] * 3, stack.report()
    assert stack.model.policy.most == {"acme": 1}, stack.report()  # type: ignore[attr-defined]
    with psycopg.connect(settings.database_url) as conn:
        keys = conn.execute(
            "SELECT DISTINCT concurrency_key FROM turns WHERE turn_id = ANY(%s)",
            ([r.id for r in results],),
        ).fetchall()
    assert keys == [("acme",)]
