"""The spend ledger: what the model calls of turns cost, what crashes wasted, what the journal
saved.

Everything is read from the journal, so nothing extra is written on the hot path:

* **billed**: each finished model step once, with the tokens of its recorded ``usage``;
* **crash waste**: the runs of a model step that were interrupted (a worker died, lost its
  claim, or lost Postgres after the call) and ran again. Every claim from the one that wrote
  the step's intent up to the one that finished it ran the call, less the runs that failed at
  the model API (noted as they fail: not billed). The request of a lost run was the same as
  the finished one (the conversation is rebuilt byte for byte), so its prompt tokens are
  known; its response was lost, so its completion tokens are *estimated* as those of the
  response that was recorded. A worker that died after writing the intent but before its
  request left counts too: Postgres cannot tell the two apart;
* **journal saved**: finished model calls that a later claim read back instead of calling
  the model again (every claim after the one that finished the step), with their tokens.

Costs come from an optional price table, ``DURABLE_AGENT_PRICES`` (USD per million prompt
and completion tokens, by the model name sent in the request); without a price for every
model involved, a cost is ``None``. A turn's child turns (child agents) are turns of their
own; ``spend --turn`` (:func:`spend_with_children`) rolls them up under their parent.

Groupings (:data:`GROUPINGS`): ``turn``, ``agent`` (the agent each turn belongs to),
``day`` (the UTC day of the call) and ``day_agent`` (both, keyed ``YYYY-MM-DD agent``: the
web console's spend page sums it both ways from one pass); each is a branch of the
``spend`` query's ``CASE :by``.
The ledger's records (:class:`~durable_agent.journal.Spend`, ``Tokens``, ``Price``) are in
:mod:`durable_agent.journal.ledger`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..journal import Price, Spend, Tokens

if TYPE_CHECKING:
    from ..journal import JournalStore, WaitStore

GROUPINGS = ("turn", "agent", "day", "day_agent")
"""What ``spend`` can group by."""


@dataclass
class _Sum:
    """Adds up the rows of one key (one row per model)."""

    key: str
    newest: datetime | None = None
    figures: dict[str, int] = field(default_factory=dict)
    costs: dict[str, float | None] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)

    def add(self, row: Mapping[str, Any], price: Price | None) -> None:
        for name, value in row.items():
            if name not in ("key", "model", "newest"):
                self.figures[name] = self.figures.get(name, 0) + int(value or 0)
        self.models.add(str(row["model"]))
        if self.newest is None or (row["newest"] is not None and row["newest"] > self.newest):
            self.newest = row["newest"]
        for part, prompt, completion in (
            ("billed", "prompt_tokens", "completion_tokens"),
            ("waste", "interrupted_prompt_tokens", "interrupted_completion_tokens"),
            ("saved", "read_back_prompt_tokens", "read_back_completion_tokens"),
        ):
            known = self.costs.get(part, 0.0)
            if price is None or known is None:
                self.costs[part] = None
            else:
                self.costs[part] = known + price.cost(int(row[prompt]), int(row[completion]))

    def spend(self) -> Spend:
        f = self.figures
        return Spend(
            key=self.key,
            billed=Tokens(
                f["calls"], f["prompt_tokens"], f["completion_tokens"], self.costs["billed"]
            ),
            crash_waste=Tokens(
                f["interrupted_calls"],
                f["interrupted_prompt_tokens"],
                f["interrupted_completion_tokens"],
                self.costs["waste"],
            ),
            journal_saved=Tokens(
                f["read_back_calls"],
                f["read_back_prompt_tokens"],
                f["read_back_completion_tokens"],
                self.costs["saved"],
            ),
            failed_calls=f["failed_calls"],
            calls_without_usage=f["calls_without_usage"],
            models=tuple(sorted(self.models)),
        )


def _fold(rows: Iterable[Mapping[str, Any]], prices: Mapping[str, Price]) -> list[_Sum]:
    sums: dict[str, _Sum] = {}
    for row in rows:
        key = str(row["key"])
        sums.setdefault(key, _Sum(key)).add(row, prices.get(str(row["model"])))
    return list(sums.values())


def check_grouping(by: Any) -> str:
    if by not in GROUPINGS:
        raise InvalidArgument(f"spend is grouped by one of {', '.join(GROUPINGS)}, not {by!r}")
    return str(by)


def spend_report(
    store: JournalStore,
    prices: Mapping[str, Price],
    *,
    by: str = "turn",
    limit: int = 50,
    since: datetime | None = None,
) -> list[Spend]:
    """The ledger per turn (newest first) or per day (latest first), at most ``limit``."""
    check_grouping(by)
    sums = _fold(store.spend_rows(by, None, since), prices)
    if by == "turn":
        sums.sort(key=lambda s: (s.newest is not None, s.newest, s.key), reverse=True)
    else:
        sums.sort(key=lambda s: s.key, reverse=True)
    return [s.spend() for s in sums[:limit]]


def spend_of_turns(
    store: JournalStore, prices: Mapping[str, Price], turn_ids: list[str]
) -> dict[str, Spend]:
    """The ledger of each of these turns (an empty one for a turn with no model call)."""
    if not turn_ids:
        return {}
    found = {s.key: s.spend() for s in _fold(store.spend_rows("turn", turn_ids), prices)}
    return {turn_id: found.get(turn_id, Spend(key=turn_id)) for turn_id in turn_ids}


def total(spends: Iterable[Spend]) -> Spend:
    """The sum of several ledgers (a cost is None if any part's is)."""

    def add(a: Tokens, b: Tokens) -> Tokens:
        cost = None if a.cost is None or b.cost is None else a.cost + b.cost
        return Tokens(
            a.calls + b.calls,
            a.prompt_tokens + b.prompt_tokens,
            a.completion_tokens + b.completion_tokens,
            cost,
        )

    result = Spend(key="total")
    for s in spends:
        result = Spend(
            key="total",
            billed=add(result.billed, s.billed),
            crash_waste=add(result.crash_waste, s.crash_waste),
            journal_saved=add(result.journal_saved, s.journal_saved),
            failed_calls=result.failed_calls + s.failed_calls,
            calls_without_usage=result.calls_without_usage + s.calls_without_usage,
            models=tuple(sorted(set(result.models) | set(s.models))),
        )
    return result


def spend_with_children(
    store: JournalStore, waits: WaitStore, prices: Mapping[str, Price], turn_id: str
) -> list[Spend]:
    """The ledger of a turn and of each child turn under it (``ctx.run_agent``, an agent as
    a tool, at any depth), parent first; :func:`total` of them is what the turn cost."""
    order: list[tuple[str, str]] = [(turn_id, turn_id)]
    level = [turn_id]
    while level:  # one query per depth
        children = waits.children_of(level)
        level = [c.turn_id for c in children]
        order += [
            (c.turn_id, f"{'  ' * c.depth}child {c.turn_id} ({c.agent}, step {c.parent_step})")
            for c in children
        ]
    ledgers = spend_of_turns(store, prices, [t for t, _ in order])
    return [dataclasses.replace(ledgers[t], key=label) for t, label in order]
