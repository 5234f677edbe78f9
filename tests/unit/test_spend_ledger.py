"""The spend ledger's pieces that need no database: the price table and how rows add up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agent import ConfigurationError, Settings
from durable_agent.operate.spend import Price, Spend, Tokens, _fold, parse_prices, total
from durable_agent.settings import load_settings


def test_prices_parse_per_model() -> None:
    prices = parse_prices(" gpt-4o-mini = 0.15/0.60 ,gpt-4o=2.5/10,")
    assert prices == {"gpt-4o-mini": Price(0.15, 0.60), "gpt-4o": Price(2.5, 10.0)}
    assert prices["gpt-4o"].cost(1_000_000, 100_000) == pytest.approx(3.5)
    assert parse_prices("") == {}


@pytest.mark.parametrize("bad", ["gpt-4o", "gpt-4o=1", "gpt-4o=a/b", "=1/2", "m=1/2/3", "m=1./.."])
def test_a_bad_price_table_is_one_configuration_error(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_PRICES", bad)
    with pytest.raises(ConfigurationError, match="PRICES"):
        load_settings()


def test_settings_give_the_price_table() -> None:
    assert Settings(prices="m=1/2").price_table == {"m": Price(1.0, 2.0)}


def _row(key: str, model: str, **figures: int) -> dict[str, Any]:
    names = (
        "calls",
        "calls_without_usage",
        "prompt_tokens",
        "completion_tokens",
        "interrupted_calls",
        "interrupted_prompt_tokens",
        "interrupted_completion_tokens",
        "failed_calls",
        "read_back_calls",
        "read_back_prompt_tokens",
        "read_back_completion_tokens",
    )
    return {
        "key": key,
        "model": model,
        "newest": datetime(2026, 1, 1, tzinfo=UTC),
        **{n: figures.get(n, 0) for n in names},
    }


def test_rows_of_several_models_add_up_and_cost_by_model() -> None:
    rows = [
        _row("t", "a", calls=1, prompt_tokens=1000, completion_tokens=100),
        _row("t", "b", calls=2, prompt_tokens=2000, completion_tokens=0, interrupted_calls=1),
    ]
    [both] = [s.spend() for s in _fold(rows, {"a": Price(1, 10), "b": Price(2, 2)})]
    assert (both.billed.calls, both.billed.prompt_tokens, both.crash_waste.calls) == (3, 3000, 1)
    assert both.billed.cost == pytest.approx((1000 + 1000 + 4000) / 1e6)
    assert both.models == ("a", "b")
    [unpriced] = [s.spend() for s in _fold(rows, {"a": Price(1, 10)})]
    assert unpriced.billed.cost is None  # model b has no price


def test_total_adds_ledgers() -> None:
    a = Spend("x", billed=Tokens(1, 10, 1, 0.5), crash_waste=Tokens(1, 10, 1, 0.5))
    b = Spend("y", billed=Tokens(2, 20, 2, None), models=("m",))
    summed = total([a, b])
    assert (summed.billed.calls, summed.billed.prompt_tokens, summed.billed.cost) == (3, 30, None)
    assert summed.crash_waste.cost == 0.5 and summed.models == ("m",)
