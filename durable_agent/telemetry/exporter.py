"""``durable-agent metrics``: the fleet's figures for Prometheus, read from Postgres at each
scrape (the ``metrics`` extra).

Postgres holds every turn, step, claim, approval and resolution of the fleet, so one
exporter reading it gives the whole fleet's figures, whichever worker (or pool child) did
the work, with nothing counted in the workers and nothing lost when one is killed: turns by
agent and status, steps by kind, tool and replay label, the step and turn latency
histograms, the takeovers (claims ended for a dead or expired holder: the turns' crashes),
open uncertain effects, pending approvals, model calls, tokens and cost by agent, and the
messages in the dead-letter queues. What only happens in a worker's main process (the
sweeper's re-sends, poison messages) is counted there (``counters.py``).

The counters are totals over the turns Postgres still holds: ``durable-agent prune`` lowers
them, which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..errors import DurableAgentError
from ..journal import Spend

log = logging.getLogger(__name__)

STEP_SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
TURN_SECONDS = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0]


class FleetReads(Protocol):
    """What the exporter reads of the journal (``journal/observed.py``)."""

    def metric_turns(self) -> list[dict[str, Any]]: ...

    def metric_steps(self, bounds: list[float]) -> list[dict[str, Any]]: ...

    def metric_turn_latency(self, bounds: list[float]) -> list[dict[str, Any]]: ...

    def metric_open_work(self) -> list[dict[str, Any]]: ...

    def metric_queues(self) -> list[str]: ...


class FleetCollector:
    """A Prometheus collector that reads the figures at each scrape."""

    def __init__(
        self,
        store: FleetReads,
        spend_by_agent: Callable[[], list[Spend]],
        dead_letters: Callable[[list[str]], dict[str, int]],
    ) -> None:
        self.store = store
        self.spend_by_agent = spend_by_agent
        self.dead_letters = dead_letters

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time only (no query when registered)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        up = GaugeMetricFamily(
            "durable_agent_up", "1 when Postgres answered this scrape, 0 when it did not"
        )
        try:
            figures = list(self._figures())
        except DurableAgentError as error:
            log.warning("metrics: cannot read the fleet's figures: %s", error)
            up.add_metric([], 0)
            yield up
            return
        yield from figures
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily(
            "durable_agent_scrape_seconds", "How long reading the figures took"
        )
        took.add_metric([], time.perf_counter() - started)
        yield took

    def _figures(self) -> Iterator[Metric]:
        turns = GaugeMetricFamily(
            "durable_agent_turns", "Turns recorded, by agent and status", labels=["agent", "status"]
        )
        takeovers = CounterMetricFamily(
            "durable_agent_takeovers",
            "Claims ended for a holder that died or whose lease ran out (the turns' crashes)",
            labels=["agent"],
        )
        taken: dict[str, int] = defaultdict(int)
        for row in self.store.metric_turns():
            turns.add_metric([row["agent"], row["status"]], row["turns"])
            taken[row["agent"]] += int(row["takeovers"])
        for agent, count in sorted(taken.items()):
            takeovers.add_metric([agent], count)
        yield turns
        yield takeovers

        steps = CounterMetricFamily(
            "durable_agent_steps",
            "Steps recorded done, by kind (model, tool), name and replay label",
            labels=["kind", "name", "replay"],
        )
        counted: dict[tuple[str, str, str], int] = defaultdict(int)
        by_kind: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in self.store.metric_steps(STEP_SECONDS):
            counted[(row["kind"], row["name"], row["replay"])] += int(row["steps"])
            by_kind[(row["kind"],)].append(row)
        for labels, count in sorted(counted.items()):
            steps.add_metric(list(labels), count)
        yield steps
        yield histogram(
            "durable_agent_step_duration_seconds",
            "Steps from intent to recorded outcome, by kind",
            ["kind"],
            STEP_SECONDS,
            by_kind,
            "steps",
        )

        by_turn: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in self.store.metric_turn_latency(TURN_SECONDS):
            by_turn[(row["agent"], row["status"])].append(row)
        yield histogram(
            "durable_agent_turn_duration_seconds",
            "Finished turns from recorded to ended, by agent and status",
            ["agent", "status"],
            TURN_SECONDS,
            by_turn,
            "turns",
        )

        uncertain = GaugeMetricFamily(
            "durable_agent_uncertain_effects_open",
            "never-tool calls that may or may not have happened and have no verdict yet",
            labels=["agent"],
        )
        approvals = GaugeMetricFamily(
            "durable_agent_approvals_pending",
            "Tool calls of waiting turns that wait for a person's decision",
            labels=["agent"],
        )
        for row in self.store.metric_open_work():
            target = uncertain if row["what"] == "uncertain" else approvals
            target.add_metric([row["agent"]], row["open"])
        yield uncertain
        yield approvals

        yield from spend_metrics(self.spend_by_agent())

        dead = GaugeMetricFamily(
            "durable_agent_dead_letters",
            "Poison messages waiting in a turn queue's dead-letter queue (<queue>.dead)",
            labels=["queue"],
        )
        for queue, count in sorted(self.dead_letters(self.store.metric_queues()).items()):
            dead.add_metric([queue], count)
        yield dead


def histogram(
    name: str,
    documentation: str,
    labels: list[str],
    bounds: list[float],
    rows: dict[tuple[str, ...], list[dict[str, Any]]],
    count_key: str,
) -> HistogramMetricFamily:
    """A histogram from ``width_bucket`` rows: row ``bucket`` i (0..len(bounds)) holds the
    values of bounds[i-1] <= v < bounds[i]; Prometheus's bucket ``le=bounds[i]`` is the sum
    of rows 0..i."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, found in sorted(rows.items()):
        per_bucket = [0] * (len(bounds) + 1)
        total = 0.0
        for row in found:
            per_bucket[int(row["bucket"])] += int(row[count_key])
            total += float(row["seconds"])
        cumulative, buckets = 0, []
        for i, bound in enumerate(bounds):
            cumulative += per_bucket[i]
            buckets.append((_le(bound), cumulative))
        buckets.append(("+Inf", cumulative + per_bucket[-1]))
        family.add_metric(list(key), buckets, total)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def spend_metrics(ledgers: list[Spend]) -> Iterator[Metric]:
    """Model calls, tokens and cost by agent, as the spend ledger bills them."""
    calls = CounterMetricFamily(
        "durable_agent_model_calls", "Model calls billed, by agent", labels=["agent"]
    )
    tokens = CounterMetricFamily(
        "durable_agent_model_tokens",
        "Tokens billed, by agent and type (input: prompt, output: completion)",
        labels=["agent", "type"],
    )
    cost = CounterMetricFamily(
        "durable_agent_model_cost_usd",
        "What the model calls cost, by agent (DURABLE_AGENT_PRICES; absent without a price)",
        labels=["agent"],
    )
    wasted = CounterMetricFamily(
        "durable_agent_crash_waste_tokens",
        "Tokens of model calls whose outcome a crash lost (billed, then asked again)",
        labels=["agent"],
    )
    for ledger in ledgers:
        billed = ledger.billed
        calls.add_metric([ledger.key], billed.calls)
        tokens.add_metric([ledger.key, "input"], billed.prompt_tokens)
        tokens.add_metric([ledger.key, "output"], billed.completion_tokens)
        if billed.cost is not None:
            cost.add_metric([ledger.key], billed.cost)
        waste = ledger.crash_waste
        wasted.add_metric([ledger.key], waste.prompt_tokens + waste.completion_tokens)
    yield from (calls, tokens, cost, wasted)


def registry_of(collector: FleetCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def serve(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Serve ``/metrics`` from a thread; returns the server (``shutdown()`` stops it)."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server


def dead_letter_counter(broker_url: str) -> Callable[[list[str]], dict[str, int]]:
    """Counts the messages of each ``<queue>.dead`` list on a Redis broker (none elsewhere)."""
    if not broker_url.startswith(("redis://", "rediss://")):
        return lambda queues: {}
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2.0, socket_connect_timeout=2.0)

    def count(queues: list[str]) -> dict[str, int]:
        try:
            return {queue: int(client.llen(queue + ".dead")) for queue in queues}
        except redis.RedisError as error:
            log.warning("metrics: cannot read the dead-letter queues: %s", error)
            return {}

    return count
