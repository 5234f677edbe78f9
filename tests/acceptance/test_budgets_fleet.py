"""Model budgets with real prefork workers: turns that find no budget wait without holding a
worker and are never failed; a worker SIGKILLed with reservations in flight leaks no budget
for more than one lease; the scripted model, enforcing the same tokens a minute, sends no
429."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from durable_agent.operate.budgets import estimate_tokens
from durable_agent.runtime import Runtime
from durable_agent.step.loop import initial_messages
from durable_agent.testing import reply
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

TURNS = 12


def short_answer(body: dict[str, Any]) -> dict[str, Any]:
    return reply("ok")


@pytest.mark.long
def test_turns_wait_for_budget_without_failing_and_a_killed_worker_leaks_nothing(
    stack: Stack, spawn: Spawn
) -> None:
    stack.model.policy = short_answer
    base = stack.settings.model_copy(
        update={"system_prompt": "", "budget_completion_tokens": 8, "budget_burst_seconds": 3.0}
    )
    probe = Runtime(base)
    body = {
        "model": base.model,
        "messages": initial_messages("", [], "turn 00"),
        "tools": probe.agents["default"].tools.openai_schemas(),
    }
    probe.close()
    per_call = estimate_tokens(body, 8)
    tpm = per_call * 4 * 20  # a bucket of 4 calls (3 s), then one call every 0.75 s
    settings = base.model_copy(update={"model_limits": f"{base.model}=tpm:{tpm}"})
    stack.model.tpm_limit = tpm  # the provider counts the same minute
    runtime = Runtime(settings)
    budgets = runtime.budgets
    assert budgets is not None
    try:
        stack.model.hold()
        first = spawn(settings=settings, pool="prefork", concurrency=6)
        turn_ids = [runtime.start_turn(f"s-budget-{i}", f"turn {i:02d}") for i in range(TURNS)]
        stack.model.wait_for_waiting(4, timeout=30)  # the bucket's four calls are in flight
        (use,) = budgets.use()
        assert use.in_flight == 4, use
        wait_until(lambda: budgets.use()[0].waits >= 2, 10, "turns to find no budget")
        first.kill(signal.SIGKILL)
        assert stack.wait_exit(first, 10) == -signal.SIGKILL
        killed_at = time.monotonic()
        # the dead worker's reservations leave the books within a lease; the bucket refills
        wait_until(lambda: budgets.use()[0].in_flight == 0, 10, "the reservations to expire")
        assert time.monotonic() - killed_at <= settings.lease_seconds + 1.0
        stack.model.release()
        spawn(settings=settings, pool="prefork", concurrency=6)
        turns = [stack.wait_turn(t, timeout=90) for t in turn_ids]
    finally:
        stack.model.release()
        runtime.close()
    report = stack.report()
    assert [t.status for t in turns] == ["done"] * TURNS, report
    assert all(t.crashes <= 1 for t in turns), report
    crashes = [t.crashes for t in turns]
    # the four killed mid-call, and any of the other two slots' turns killed between their
    # claim and their wait for budget
    assert 4 <= sum(crashes) <= 6, (crashes, report)
    after = Runtime(settings)
    assert after.budgets is not None
    (use,) = after.budgets.use()
    after.close()
    assert use.waits >= TURNS - 4, use  # most turns waited at least once
    assert use.rate_limited == 0 and stack.model.rate_limited == 0, use
    assert use.in_flight == 0
