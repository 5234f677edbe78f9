"""Model budgets on the real Redis: reserve, settle, 429s, a reservation whose worker died,
and what ``durable-agent limits`` shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from durable_agent.errors import BudgetExhausted, ModelRateLimited
from durable_agent.operate.budgets import Budgets, ModelBudget, estimate_tokens
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until


def budget(settings: Settings, **limit: int) -> tuple[Budgets, ModelBudget]:
    model = f"model-{uuid.uuid4().hex[:8]}"
    spec = "/".join(f"{k}:{v}" for k, v in limit.items())
    budgets = Budgets(settings.model_copy(update={"model_limits": f"{model}={spec}"}))
    found = budgets.for_model(model)
    assert found is not None
    return budgets, found


def request(chars: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "x" * chars}], **extra}


def test_a_call_takes_its_estimate_and_gives_back_what_it_did_not_use(settings: Settings) -> None:
    # 600 tokens a minute, 6 s of burst: a bucket of 60 tokens refilled at 10 a second
    budgets, model = budget(settings, tpm=600)
    body = request(100, max_tokens=10)
    prompt = len(json.dumps(body["messages"], separators=(",", ":"))) // 4
    assert prompt + 10 <= estimate_tokens(body, 256) <= prompt + 10 + 15  # + model, keys
    assert estimate_tokens(request(100), 256) == estimate_tokens(body, 256) - 10 + 256
    first = model.reserve(body)  # about 40 tokens of 60
    with pytest.raises(BudgetExhausted) as waited:
        model.reserve(body)
    assert 0.5 < waited.value.retry_after <= 4.0
    first.settle({"total_tokens": 5})  # used 5: the rest comes back
    second = model.reserve(body)
    second.release()  # never made: all of it back
    (use,) = budgets.use()
    assert use.tokens_free is not None and use.tokens_free >= 50
    assert (use.reserved, use.waits, use.rate_limited, use.in_flight) == (2, 1, 0, 0)
    budgets.close()


def test_a_429_empties_the_bucket_and_the_next_call_waits(settings: Settings) -> None:
    budgets, model = budget(settings, rpm=600, tpm=6000)
    reservation = model.reserve(request(40))
    reservation.rate_limited()
    (use,) = budgets.use()
    assert use.rate_limited == 1 and use.tokens_free is not None and use.tokens_free < 50
    with pytest.raises(BudgetExhausted):
        model.reserve(request(2000))
    budgets.close()


def test_requests_a_minute_alone_are_a_budget(settings: Settings) -> None:
    budgets, model = budget(settings, rpm=20)  # a bucket of 2 requests, refilled 18 a minute
    model.reserve(request(10)).settle(None)
    model.reserve(request(10)).settle(None)
    with pytest.raises(BudgetExhausted) as waited:
        model.reserve(request(10))
    assert 3.0 < waited.value.retry_after <= 3.5  # one request a (60 - 6)/18 s
    budgets.close()


def test_a_reservation_whose_worker_died_leaves_the_books_within_a_lease(
    settings: Settings,
) -> None:
    """Reserved, never settled (the process is gone): it no longer counts as in flight once
    its lease is over, and the bucket is full again within one burst."""
    short = settings.model_copy(update={"lease_seconds": 1.0, "budget_burst_seconds": 1.0})
    budgets, model = budget(short, tpm=6000)  # a bucket of 100 tokens, 100 a second
    model.reserve(request(200, max_tokens=1))  # about 65 tokens, never settled
    (use,) = budgets.use()
    assert use.in_flight == 1 and use.tokens_free is not None and use.tokens_free < 50
    started = time.monotonic()

    def healed() -> bool:
        model.reserve(request(0, max_tokens=1)).release()  # a call purges what expired
        (now,) = budgets.use()
        return now.in_flight == 0 and now.tokens_free == 100

    wait_until(healed, 5, "the dead reservation to leave the books")
    assert time.monotonic() - started < 1.0 + 0.5
    budgets.close()


def test_a_turn_context_settles_a_call_and_feeds_a_429_back(settings: Settings) -> None:
    from durable_agent.step.loop import _settled

    budgets, model = budget(settings, tpm=6000)
    reservation = model.reserve(request(40))

    def answered(body: dict[str, Any]) -> dict[str, Any]:
        return {"message": {"content": "ok"}, "usage": {"total_tokens": 3}}

    _settled(answered, reservation)(request(40))
    assert not reservation.open
    limited = model.reserve(request(40))

    def refused(body: dict[str, Any]) -> dict[str, Any]:
        raise ModelRateLimited("the model API answered 429")

    with pytest.raises(ModelRateLimited):
        _settled(refused, limited)(request(40))
    (use,) = budgets.use()
    assert use.rate_limited == 1
    budgets.close()


def test_durable_agent_limits_shows_each_budget(settings: Settings) -> None:
    env = {**os.environ, **settings_env(settings)}
    env["DURABLE_AGENT_MODEL_LIMITS"] = "gpt-x=rpm:60/tpm:1200"
    shown = subprocess.run(
        [sys.executable, "-m", "durable_agent", "limits", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert row["budget"].startswith("gpt-x@") and (row["rpm"], row["tpm"]) == (60, 1200)
    env.pop("DURABLE_AGENT_MODEL_LIMITS")
    none = subprocess.run(
        [sys.executable, "-m", "durable_agent", "limits"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert none.returncode == 2 and none.stderr.startswith("error: no model budgets")
    env["DURABLE_AGENT_MODEL_LIMITS"] = "gpt-x=rpm:lots"
    bad = subprocess.run(
        [sys.executable, "-m", "durable_agent", "limits"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "not a limit" in bad.stderr and "Traceback" not in bad.stderr
