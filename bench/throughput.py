"""Turn throughput and latency: durable-agent's workers against a bare Celery task.

Both sides run the same turn (model -> lookup_note -> model -> send_email -> model) against
the same in-process scripted model (zero latency) and SMTP inbox, on the same Redis, with
the same number of worker processes and the same pool:

* ours: ``durable-agent worker`` processes; turns go in with ``start_turn`` and are done
  when Postgres says so;
* the baseline: ``celery -A bench.bare_app worker`` processes running ``bench.bare_turn``, the
  same loop with no journal, no claim, no sweeper (see ``bench/bare_app.py``).

Like with like: the bare task does not stream its model calls, so ours do not stream here
either (``DURABLE_AGENT_STREAM=false``; streaming is the default of our built-in loops).

Each configuration (1, 2 and 4 workers; solo, and prefork with one child per worker) runs
its rounds alternately (bare, ours, bare, ours ...) while the other side's workers stand
idle; a round submits ``turns`` turns at once and measures from the first submit to the
last turn done. Latency: one turn at a time, from submit to done.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, forget_queue, settings_env, wait_until

from . import REDIS_URL, scratch_database, spread

MESSAGE = "Please email the note 'launch' to ada@example.com."
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Throughput:
    pool: str
    workers: int
    ours: list[float]  # turns/s per round
    bare: list[float]

    @property
    def ratio(self) -> float:
        """Our throughput as a share of the bare task's (the goal: >= 0.8)."""
        return statistics.median(self.ours) / statistics.median(self.bare)

    def as_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "workers": self.workers,
            "ours_turns_per_s": self.ours,
            "bare_turns_per_s": self.bare,
            "ratio": self.ratio,
            "ratio_per_round": [o / b for o, b in zip(self.ours, self.bare, strict=True)],
        }


class BareWorker(WorkerProcess):
    """A ``celery -A bench.bare_app worker`` process (the baseline)."""

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker",
            "--pool", self.pool, "--concurrency", str(self.concurrency),
            "--without-mingle", "--without-gossip", "--loglevel", "INFO",
            "--hostname", f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
        ]  # fmt: skip


class Bench:
    """The servers, the database and the two sides' settings for one benchmark run."""

    def __init__(
        self,
        url: str,
        logs: Path,
        model: ScriptedModelServer,
        inbox: SmtpInbox,
        *,
        stream: bool | None = None,
    ):
        """``stream``: whether our workers stream their model calls (None: the default)."""
        tag = uuid.uuid4().hex[:8]
        streaming = {} if stream is None else {"stream": stream}
        base = dict(
            database_url=url,
            broker_url=REDIS_URL,
            tools="durable_agent_examples.email_tools",
            openai_base_url=model.base_url,
            openai_api_key="bench",
            model="scripted-model",
            model_max_retries=0,
        )
        self.ours = Settings(**base, **streaming, queue=f"bench-ours-{tag}")
        self.bare = Settings(**base, queue=f"bench-bare-{tag}")
        self.runtime = Runtime(self.ours)
        self.logs = logs
        self.servers = {"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url}
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.pg = psycopg.connect(url, autocommit=True)

    def start(self, side: str, pool: str, count: int) -> list[WorkerProcess]:
        settings = self.ours if side == "ours" else self.bare
        env = {**settings_env(settings), **self.servers, "PYTHONPATH": str(ROOT)}
        kind = WorkerProcess if side == "ours" else BareWorker
        workers = [
            kind(env, self.logs / f"{side}-{pool}-{n}.log", pool=pool, concurrency=1,
                 name=f"{side}{n}")
            for n in range(count)
        ]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready(60)
        return workers

    def round_ours(self, turns: int) -> float:
        run = uuid.uuid4().hex[:8]
        started = time.perf_counter()
        for n in range(turns):
            self.runtime.start_turn(f"bench-{run}-{n}", MESSAGE)
        wait_until(lambda: self._done(run) >= turns, 300, f"{turns} turns", interval=0.01)
        return turns / (time.perf_counter() - started)

    def _done(self, run: str) -> int:
        row = self.pg.execute(
            "SELECT count(*) FROM turns WHERE session_id LIKE %s AND status = 'done'",
            (f"bench-{run}-%",),
        ).fetchone()
        return int(row[0]) if row else 0

    def round_bare(self, turns: int) -> float:
        run = uuid.uuid4().hex[:8]
        app = self.bare_app()
        started = time.perf_counter()
        for n in range(turns):
            app.send_task("bench.bare_turn", args=(f"bench-{run}-{n}", MESSAGE, run))
        wait_until(
            lambda: int(self.redis.get(f"bench:bare:{run}") or 0) >= turns,
            300,
            f"{turns} bare turns",
            interval=0.01,
        )
        return turns / (time.perf_counter() - started)

    def latency_ours(self) -> float:
        run = uuid.uuid4().hex[:8]
        turn_id = self.runtime.start_turn(f"lat-{run}", MESSAGE)
        wait_until(lambda: self.runtime.get_turn(turn_id).finished, 60, "the turn", 0.002)
        turn = self.runtime.get_turn(turn_id)
        assert turn.finished_at is not None
        return (turn.finished_at - turn.created_at).total_seconds() * 1e3

    def latency_bare(self) -> float:
        run = uuid.uuid4().hex[:8]
        sent = time.time()
        self.bare_app().send_task("bench.bare_turn", args=(f"lat-{run}", MESSAGE, run))
        wait_until(lambda: self.redis.get(f"bench:bare:{run}:last"), 60, "the turn", 0.002)
        return (float(self.redis.get(f"bench:bare:{run}:last") or 0) - sent) * 1e3

    def bare_app(self) -> Any:
        if not hasattr(self, "_bare_app"):
            from celery import Celery

            self._bare_app = Celery("bench_sender", set_as_current=False)
            self._bare_app.conf.update(
                broker_url=REDIS_URL, task_default_queue=self.bare.queue, task_serializer="json"
            )
        return self._bare_app

    def close(self) -> None:
        for queue in (self.ours.queue, self.bare.queue):
            forget_queue(self.redis, queue)
        for key in self.redis.scan_iter("bench:bare:*"):
            self.redis.delete(key)
        self.redis.close()
        self.pg.close()
        self.runtime.close()


CONFIGS = [("solo", 1), ("solo", 2), ("solo", 4), ("prefork", 1), ("prefork", 2), ("prefork", 4)]


def run(*, rounds: int = 3, turns: int = 60, latency_samples: int = 15) -> dict[str, Any]:
    results: list[Throughput] = []
    latency: dict[str, list[float]] = {"ours": [], "bare": []}
    with (
        scratch_database() as url,
        tempfile.TemporaryDirectory(prefix="bench-") as logs,
        ScriptedModelServer(email_policy) as model,
        SmtpInbox() as inbox,
    ):
        # like with like: the bare task does not stream, so ours does not either here (what
        # streaming costs: docs/design.md, "Streaming stays the default")
        bench = Bench(url, Path(logs), model, inbox, stream=False)
        try:
            for pool, count in CONFIGS:
                workers = bench.start("bare", pool, count) + bench.start("ours", pool, count)
                try:
                    bench.round_bare(min(turns, 10))  # warm-up: imports, connections, plans
                    bench.round_ours(min(turns, 10))
                    result = Throughput(pool, count, [], [])
                    for _ in range(rounds):
                        result.bare.append(bench.round_bare(turns))
                        result.ours.append(bench.round_ours(turns))
                    results.append(result)
                    if (pool, count) == ("solo", 1):
                        for _ in range(latency_samples):
                            latency["bare"].append(bench.latency_bare())
                            latency["ours"].append(bench.latency_ours())
                finally:
                    for worker in workers:
                        worker.stop(timeout=10)
                inbox.clear()
        finally:
            bench.close()

    table = Table(title=f"Turn throughput, turns/s ({rounds} alternating rounds of {turns} turns)")
    for column in ("pool", "workers", "durable-agent", "bare Celery task", "ours / bare",
                   "ours min-max", "bare min-max"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.pool,
            str(r.workers),
            f"{statistics.median(r.ours):.1f}",
            f"{statistics.median(r.bare):.1f}",
            f"{r.ratio:.2f}x",
            spread(r.ours, "{:.1f}"),
            spread(r.bare, "{:.1f}"),
        )
    out.print(table)
    lat_ours, lat_bare = statistics.median(latency["ours"]), statistics.median(latency["bare"])
    out.print(
        f"one turn, submit to done (solo, one worker, {latency_samples} samples): "
        f"durable-agent {lat_ours:.1f} ms, bare {lat_bare:.1f} ms, {lat_ours / lat_bare:.2f}x"
    )
    return {
        "throughput": [r.as_json() for r in results],
        "latency_ms": {"ours": latency["ours"], "bare": latency["bare"]},
    }
