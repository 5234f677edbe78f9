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
    results["budgeted"] = _series(turns, budget=True)
    if baseline:
        results["unbudgeted"] = _series(turns, budget=False)
    _print(results)
    return results


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
                "least_seconds": max(0.0, (spent - TPM) / (TPM / 60)),
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
