"""Prometheus metrics, scraped over HTTP as Prometheus does: ``durable-agent metrics`` (the
fleet's figures from Postgres, a process of its own) and a worker's own counters
(``DURABLE_AGENT_METRICS_PORT``), with real workers (prefork too), after turns, a crash
taken over, an uncertain effect, a pending approval and a poison message."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("prometheus_client", reason="needs the 'metrics' extra")

from kombu import Connection, Queue
from prometheus_client.parser import text_string_to_metric_families

from durable_agent import start_turn
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    """Every sample at http://127.0.0.1:port/metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples.get((metric, frozenset(labels.items())), 0.0)


@pytest.fixture
def exporter(stack: Stack, tmp_path: Path) -> Iterator[Callable[[], Samples]]:
    """``durable-agent metrics --port P`` against the test's database and broker."""
    port = free_port()
    log = tmp_path / "metrics.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", "metrics", "--port", str(port)],
            env={**settings_env(stack.settings), "PATH": "/usr/bin:/bin"},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:

        def answers() -> bool:
            try:
                return value(scrape(port), "durable_agent_up") == 1.0
            except OSError:
                assert process.poll() is None, log.read_text()
                return False

        wait_until(answers, 30, "durable-agent metrics to answer")
        yield lambda: scrape(port)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_turns_steps_latency_and_tokens_after_turns_on_a_prefork_worker(
    stack: Stack, spawn: Spawn, exporter: Callable[[], Samples]
) -> None:
    spawn(pool="prefork", concurrency=2)
    turn_ids = [
        start_turn(f"s-metrics-{uuid.uuid4().hex[:6]}", stack.message, settings=stack.settings)
        for _ in range(3)
    ]
    for turn_id in turn_ids:
        assert stack.wait_turn(turn_id, 40).status == "done", stack.report(turn_id)

    samples = exporter()
    assert value(samples, "durable_agent_turns", agent="default", status="done") == 3
    assert value(samples, "durable_agent_takeovers_total", agent="default") == 0
    steps = "durable_agent_steps_total"
    assert value(samples, steps, kind="model", name="llm", replay="safe") == 9
    assert value(samples, steps, kind="tool", name="send_email", replay="never") == 3
    assert value(samples, steps, kind="tool", name="lookup_note", replay="safe") == 3
    assert value(samples, "durable_agent_step_duration_seconds_count", kind="model") == 9
    assert value(samples, "durable_agent_step_duration_seconds_count", kind="tool") == 6
    assert value(samples, "durable_agent_step_duration_seconds_bucket", kind="tool", le="+Inf") == 6
    turn_count = "durable_agent_turn_duration_seconds_count"
    assert value(samples, turn_count, agent="default", status="done") == 3
    assert (
        value(samples, "durable_agent_turn_duration_seconds_sum", agent="default", status="done")
        > 0
    )
    billed = stack.model.billed()
    assert value(samples, "durable_agent_model_calls_total", agent="default") == billed["calls"]
    tokens = "durable_agent_model_tokens_total"
    assert value(samples, tokens, agent="default", type="input") == billed["prompt_tokens"]
    assert value(samples, tokens, agent="default", type="output") == billed["completion_tokens"]
    assert value(samples, "durable_agent_uncertain_effects_open", agent="default") == 0


def test_a_takeover_an_uncertain_effect_and_the_sweepers_resend_are_counted(
    stack: Stack, spawn: Spawn, exporter: Callable[[], Samples]
) -> None:
    """CRASH_AT=send_email:after_run: the first worker dies after the email went out; the
    second one's sweeper sends the turn again (counted on its metrics port), it takes the
    claim over (a takeover) and answers the call as uncertain (an open uncertain effect,
    until an operator resolves it)."""
    settings = stack.settings.model_copy(update={"sweep_interval_seconds": 0.1})
    first = spawn(settings=settings, CRASH_AT="send_email:after_run")
    turn_id = start_turn(f"s-crash-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    stack.wait_exit(first)
    port = free_port()
    spawn(
        settings=settings,
        pool="prefork",
        DURABLE_AGENT_METRICS_PORT=str(port),
    )
    turn = stack.wait_turn(turn_id, 60)
    assert turn.status == "done" and turn.crashes == 1, stack.report(turn_id)

    samples = exporter()
    assert value(samples, "durable_agent_takeovers_total", agent="default") == 1
    assert value(samples, "durable_agent_uncertain_effects_open", agent="default") == 1
    worker = scrape(port)
    resends = {
        dict(labels)["reason"]: count
        for (name, labels), count in worker.items()
        if name == "durable_agent_sweeper_resends_total"
    }
    assert sum(resends.values()) >= 1, resends
    assert set(resends) <= {"claim expired", "receiver died", "message lost", "queue idle"}

    from durable_agent import resolve_uncertain

    resolve_uncertain(turn_id, 3, "happened", note="seen in the inbox", settings=settings)
    assert value(exporter(), "durable_agent_uncertain_effects_open", agent="default") == 0


def test_a_pending_approval_is_counted_until_it_is_decided(
    stack: Stack, spawn: Spawn, exporter: Callable[[], Samples]
) -> None:
    settings = stack.settings.model_copy(update={"approval_required": "send_email"})
    spawn(settings=settings)
    turn_id = start_turn(f"s-approve-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)

    def pending() -> float:
        return value(exporter(), "durable_agent_approvals_pending", agent="default")

    wait_until(lambda: pending() == 1, 30, "one pending approval")
    assert value(exporter(), "durable_agent_turns", agent="default", status="waiting") == 1

    from durable_agent import approve

    approve(turn_id, 3, by="test", settings=settings)
    assert stack.wait_turn(turn_id, 40).status == "done"
    assert pending() == 0


def _publish_unknown_task(settings: Settings) -> None:
    """A message for a task no worker has: dead-lettered by the worker that receives it."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": "nope.task",
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "timelimit": [None, None],
        "eta": None,
        "expires": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "test@metrics",
    }
    body = json.dumps([[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    with Connection(settings.broker_url) as connection:
        connection.Producer().publish(
            body,
            exchange="",
            routing_key=settings.queue,
            declare=[Queue(settings.queue, routing_key=settings.queue)],
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
        )


def test_a_poison_message_is_counted_by_the_worker_and_seen_in_its_dead_letter_queue(
    stack: Stack, spawn: Spawn, exporter: Callable[[], Samples]
) -> None:
    port = free_port()
    worker = spawn(pool="prefork", DURABLE_AGENT_METRICS_PORT=str(port))
    turn_id = start_turn(f"s-poison-{uuid.uuid4().hex[:6]}", stack.message, settings=stack.settings)
    assert stack.wait_turn(turn_id, 40).status == "done"  # the exporter knows the queue
    _publish_unknown_task(stack.settings)
    queue = stack.settings.queue

    def counted() -> float:
        return value(
            scrape(port), "durable_agent_poison_messages_total", queue=queue, where="unknown"
        )

    wait_until(lambda: counted() == 1, 30, f"the poison message counted\n{worker.log_tail()}")
    assert value(exporter(), "durable_agent_dead_letters", queue=queue) == 1
