"""The spend ledger's records: model calls and tokens (:class:`Tokens`), one ledger
(:class:`Spend`), and the price table (:class:`Price`, ``DURABLE_AGENT_PRICES``).

How a ledger is read from the journal is :mod:`durable_agent.operate.spend`; a turn carries
its ledger (``Turn.spend``), and the settings parse the price table, so the types live here,
below both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PRICE = re.compile(r"^\s*([^=\s]+)\s*=\s*([0-9.]+)\s*/\s*([0-9.]+)\s*$")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million prompt tokens and per million completion tokens."""

    prompt: float
    completion: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1_000_000


def parse_prices(text: str) -> dict[str, Price]:
    """``model=PROMPT/COMPLETION,...`` (USD per million tokens), e.g.
    ``gpt-4o-mini=0.15/0.60``; ValueError saying what is wrong."""
    prices: dict[str, Price] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _PRICE.match(item)
        if match is None:
            raise ValueError(
                f"expected MODEL=PROMPT/COMPLETION in USD per million tokens "
                f"(e.g. gpt-4o-mini=0.15/0.60), got {item!r}"
            )
        try:
            prompt, completion = float(match.group(2)), float(match.group(3))
        except ValueError:
            raise ValueError(f"not a price: {item!r}") from None
        prices[match.group(1)] = Price(prompt, completion)
    return prices


@dataclass(frozen=True, slots=True)
class Tokens:
    """Model calls, their tokens and (with a price for each model) their cost in USD."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": None if self.cost is None else round(self.cost, 6),
        }


@dataclass(frozen=True, slots=True)
class Spend:
    """The ledger of one turn, agent or day."""

    key: str = ""
    billed: Tokens = Tokens(cost=0.0)
    crash_waste: Tokens = Tokens(cost=0.0)
    journal_saved: Tokens = Tokens(cost=0.0)
    failed_calls: int = 0
    calls_without_usage: int = 0
    models: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            **self.billed.as_json(),
            "crash_waste": {**self.crash_waste.as_json(), "completion_tokens_estimated": True},
            "journal_saved": self.journal_saved.as_json(),
            "failed_calls_not_billed": self.failed_calls,
            "calls_without_usage": self.calls_without_usage,
            "models": list(self.models),
        }
