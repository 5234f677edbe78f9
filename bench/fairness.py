"""Fairness: a burst of one tenant queued before another tenant's few turns.

One real ``durable-agent worker`` with 4 prefork slots, ``DURABLE_AGENT_CONCURRENCY_PER_KEY=2``;
``BURST`` turns of tenant ``acme`` are started, then ``FEW`` of tenant ``bolt`` (each turn one
model call the scripted model answers in ``ANSWER_SECONDS``). Measured: how long after their
start ``bolt``'s turns reach the model, against one turn's time; and, as the baseline, the
same with no concurrency key (``bolt`` waits behind the whole burst).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, reply
from durable_agent.testing.harness import WorkerProcess, forget_queue, settings_env

from . import REDIS_URL, scratch_database

ANSWER_SECONDS = 0.5
ROOT = Path(__file__).resolve().parent.parent


class Arrivals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        message = str(body["messages"][-1]["content"])
        with self.lock:
            self.at.setdefault(message, time.time())
        time.sleep(ANSWER_SECONDS)
        return reply("ok")


def run(*, burst: int = 100, few: int = 5, baseline: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {"burst": burst, "few": few, "slots": 4, "per_key": 2}
    results["keyed"] = _series(burst, few, keyed=True)
    if baseline:
        results["unkeyed"] = _series(burst, few, keyed=False)
    _print(results)
    return results


def _series(burst: int, few: int, *, keyed: bool) -> dict[str, Any]:
    arrivals = Arrivals()
    with (
        scratch_database() as url,
        ScriptedModelServer(arrivals) as model,
        tempfile.TemporaryDirectory() as logs,
    ):
        settings = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=f"bench-fair-{uuid.uuid4().hex[:8]}",
            openai_base_url=model.base_url,
            openai_api_key="bench",
            tools="bench.budgets",
            system_prompt="",
            concurrency_per_key=2 if keyed else 0,
        )
        env = {**settings_env(settings), "PYTHONPATH": str(ROOT)}
        worker = WorkerProcess(
            env, Path(logs) / "worker.log", pool="prefork", concurrency=4, name="bench"
        )
        runtime = Runtime(settings)
        try:
            worker.start()
            worker.wait_ready(60)
            a = [
                runtime.start_turn(f"a-{i}", f"acme {i}", concurrency_key="acme" if keyed else None)
                for i in range(burst)
            ]
            started = time.time()
            b = [
                runtime.start_turn(f"b-{i}", f"bolt {i}", concurrency_key="bolt" if keyed else None)
                for i in range(few)
            ]
            found = [runtime.wait_for_turn(t, timeout=900, poll_seconds=1.0) for t in a + b]
            # one turn's time: from its request reaching the model to its end
            turn_seconds = statistics.median(
                t.finished_at.timestamp() - arrivals.at[t.message]
                for t in found
                if t.finished_at is not None
            )
            bolt = [arrivals.at[f"bolt {i}"] - started for i in range(few)]
            return {
                "done": sum(t.status == "done" for t in found),
                "bolt_first_seconds": min(bolt),
                "bolt_all_seconds": max(bolt),
                "turn_seconds": turn_seconds,
                "first_in_turns": min(bolt) / turn_seconds,
            }
        finally:
            worker.stop()
            runtime.close()
            client = redis.Redis.from_url(REDIS_URL)
            forget_queue(client, settings.queue)
            client.close()


def _print(results: dict[str, Any]) -> None:
    table = Table(
        title=f"fairness: {results['burst']} turns of one tenant, then {results['few']} of "
        f"another, 4 prefork slots (python -m bench fairness)"
    )
    for column in ("", "the other's first start", "its last start", "one turn", "done"):
        table.add_column(column, justify="right" if column else "left")
    for name, label in (("keyed", "2 per tenant"), ("unkeyed", "no concurrency key")):
        series = results.get(name)
        if series is None:
            continue
        table.add_row(
            label,
            f"{series['bolt_first_seconds']:.2f} s ({series['first_in_turns']:.1f} turns)",
            f"{series['bolt_all_seconds']:.2f} s",
            f"{series['turn_seconds']:.2f} s",
            f"{series['done']}",
        )
    out.print(table)
