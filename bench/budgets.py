"""Budgets: many turns against a model that enforces its own tokens-a-minute limit.

One real ``durable-agent worker`` with 6 prefork slots; a scripted model server (in this
process) that counts the tokens it served over a sliding minute and answers 429 past
``TPM`` (as providers do); the turns' model budget set to the same ``TPM``
(``DURABLE_AGENT_MODEL_LIMITS``). Every turn is one model call (a short answer). Measured:
429s the model sent, turns done and failed, how long the run took against the least time the
limit allows, and the tokens served per minute against the limit.

Beside it, as the baseline, the same turns with no budget: the workers find the limit by the
model's 429s (the SDK's retries, then the turn's deferral).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import tool
from durable_agent.testing import ScriptedModelServer, reply
from durable_agent.testing.harness import WorkerProcess, forget_queue, settings_env

from . import REDIS_URL, scratch_database

TPM = 10_000
SLOTS = 6
ROOT = Path(__file__).resolve().parent.parent


@tool(replay="safe")
def ping() -> str:
    """Answer pong."""
    return "pong"


def answer(body: dict[str, Any]) -> dict[str, Any]:
    return reply("ok")


def run(*, turns: int = 300, baseline: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {"tpm": TPM, "slots": SLOTS, "turns": turns}
    results["reserve_us"] = _reserve_cost(200 if baseline else 50)
    results["budgeted"] = _series(turns, budget=True)
    if baseline:
        results["unbudgeted"] = _series(turns, budget=False)
    _print(results)
    return results


_PG_BUCKET = """
UPDATE bench_bucket SET
    tokens = least(%(cap)s, tokens + extract(epoch FROM clock_timestamp() - ts) * %(rate)s)
             - %(want)s,
    ts = clock_timestamp()
WHERE name = 'm'
  AND least(%(cap)s, tokens + extract(epoch FROM clock_timestamp() - ts) * %(rate)s) >= %(want)s
RETURNING tokens
"""


def _reserve_cost(samples: int) -> dict[str, float]:
    """One reservation (and its settlement) as our Lua script on Redis, and as the same
    bucket in a Postgres row (one UPDATE each, autocommit): median microseconds."""
    import psycopg

    from durable_agent.operate.budgets import Budgets

    budgets = Budgets(
        Settings(
            broker_url=REDIS_URL,
            model_limits="bench-model=tpm:1000000000",
            openai_api_key=uuid.uuid4().hex,
        )
    )
    model = budgets.for_model("bench-model")
    assert model is not None
    body = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}
    redis_us = []
    for _ in range(samples):
        started = time.perf_counter()
        model.reserve(body).settle({"total_tokens": 10})
        redis_us.append((time.perf_counter() - started) * 1e6)
    budgets.close()
    with scratch_database() as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_bucket (name text PRIMARY KEY, tokens float8, ts timestamptz)"
        )
        conn.execute("INSERT INTO bench_bucket VALUES ('m', 1e9, clock_timestamp())")
        args = {"cap": 1e9, "rate": 1e6, "want": 266}
        postgres_us = []
        for _ in range(samples):
            started = time.perf_counter()
            conn.execute(_PG_BUCKET, args).fetchone()
            conn.execute(_PG_BUCKET, {**args, "want": -256}).fetchone()
            postgres_us.append((time.perf_counter() - started) * 1e6)
    return {
        "redis_lua": statistics.median(redis_us),
        "postgres_row": statistics.median(postgres_us),
    }


def _series(turns: int, *, budget: bool) -> dict[str, Any]:
    with (
        scratch_database() as url,
        ScriptedModelServer(answer) as model,
        tempfile.TemporaryDirectory() as logs,
    ):
        model.tpm_limit = TPM
        settings = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=f"bench-budget-{uuid.uuid4().hex[:8]}",
            openai_base_url=model.base_url,
            openai_api_key=f"bench-{uuid.uuid4().hex[:8]}",  # a budget of its own
            tools="bench.budgets",
            system_prompt="",
            model_max_retries=2,
            retry_backoff_max_seconds=5.0,
            model_limits=f"gpt-4o-mini=tpm:{TPM}" if budget else "",
            budget_completion_tokens=16,
        )
        env = {**settings_env(settings), "PYTHONPATH": str(ROOT)}
        worker = WorkerProcess(
            env, Path(logs) / "worker.log", pool="prefork", concurrency=SLOTS, name="bench"
        )
        runtime = Runtime(settings)
        try:
            worker.start()
            worker.wait_ready(60)
            started = time.monotonic()
            ids = [runtime.start_turn(f"s-{i}", f"turn {i}") for i in range(turns)]
            found = [runtime.wait_for_turn(t, timeout=900, poll_seconds=1.0) for t in ids]
            elapsed = time.monotonic() - started
            billed = model.billed()
            spent = billed["prompt_tokens"] + billed["completion_tokens"]
            use = runtime.budgets.use()[0].as_json() if runtime.budgets else None
            return {
                "seconds": elapsed,
                "done": sum(t.status == "done" for t in found),
                "failed": sum(t.status == "failed" for t in found),
                "rate_limited": model.rate_limited,
                "requests": model.request_count,
                "tokens": spent,
                # a provider's sliding minute serves at most TPM in any 60 s: the least time
                "least_seconds": 60.0 * max(0, math.ceil(spent / TPM) - 1),
                "tokens_per_minute": spent / elapsed * 60,
                "budget": use,
            }
        finally:
            worker.stop()
            runtime.close()
            client = redis.Redis.from_url(REDIS_URL)
            forget_queue(client, settings.queue)
            client.close()


def _print(results: dict[str, Any]) -> None:
    table = Table(
        title=f"budgets: {results['turns']} turns, {results['slots']} prefork slots, a model "
        f"enforcing {results['tpm']:,} tokens a minute (python -m bench budgets)"
    )
    for column in ("", "429s", "done", "failed", "seconds", "the limit allows", "tokens / min"):
        table.add_column(column, justify="right" if column else "left")
    for name in ("budgeted", "unbudgeted"):
        series = results.get(name)
        if series is None:
            continue
        table.add_row(
            "with the budget" if name == "budgeted" else "no budget (429s and retries)",
            f"{series['rate_limited']:,}",
            f"{series['done']:,}",
            f"{series['failed']:,}",
            f"{series['seconds']:.0f}",
            f"{series['least_seconds']:.0f}",
            f"{series['tokens_per_minute']:,.0f}",
        )
    out.print(table)
    cost = results["reserve_us"]
    out.print(
        f"one reservation and its settlement: {cost['redis_lua']:,.0f} µs (Lua on Redis), "
        f"{cost['postgres_row']:,.0f} µs (the same bucket as a Postgres row)"
    )
