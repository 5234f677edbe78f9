"""psycopg 3 with named SQL on the hot path, SQLAlchemy at the application's door: the figures
of docs/design/why-psycopg.md (``python -m bench door``).

1. The statements of one email turn (five calls: model, ``safe`` tool, model, ``never``
   tool, model) as a worker sends them, counted by query name (in-process: the scripted
   model, the SMTP inbox, ``TurnWorker.handle``).
2. One statement three ways, interleaved: ``find_turn`` (a primary-key read of a turn row,
   26 columns; a read, so the WAL flush does not drown the difference) on our path (prepared,
   the process's kept autocommit connection), through SQLAlchemy Core on a kept connection in
   autocommit (``text()``, the same psycopg underneath), and as applications use SQLAlchemy
   (a pooled connection, BEGIN, the statement, COMMIT).
3. Importing the worker (``durable_agent.tasks``) with and without SQLAlchemy's ORM.
4. A start: ``start_turn`` on our connection against ``start_turn(connection=session)`` in
   the application's transaction (statements inside it, and the commit that rings).
5. The doorbell of a turn started on a psycopg connection: seconds from the commit until the
   sweeper (default interval and grace) sent it.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import redis
from rich.table import Table

from durable_agent import start_turn
from durable_agent.cli.console import out
from durable_agent.delivery.sweeper import SweeperThread
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.journal import db as db_module
from durable_agent.journal.queries import query
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import load_tools
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import forget_queue

from . import REDIS_URL, interleaved, scratch_database, spread

MESSAGE = "Please email the note 'launch' to ada@example.com."
STATEMENTS_PER_REP = 500


@contextlib.contextmanager
def _counting() -> Iterator[collections.Counter[str]]:
    """Count every named query sent through durable_agent.journal.db while inside."""
    counts: collections.Counter[str] = collections.Counter()
    original = db_module._run

    def counted(conn: Any, q: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        counts[q.name] += 1
        return original(conn, q, params, *args, **kwargs)

    db_module._run = counted  # type: ignore[assignment]
    try:
        yield counts
    finally:
        db_module._run = original  # type: ignore[assignment]


def statements_of_a_turn(settings: Settings) -> dict[str, int]:
    """What TurnWorker.handle sends for one five-call email turn, by query name."""
    runtime = Runtime(settings, tools=load_tools(["durable_agent_examples.email_tools"]))
    try:
        worker = TurnWorker(runtime)
        warm = runtime.journal.create_turn("warm-up", MESSAGE)
        worker.handle(warm.turn_id)
        turn = runtime.journal.create_turn("counted", MESSAGE)
        with _counting() as counts:
            delivery = worker.handle(turn.turn_id)
        if delivery.outcome != "done":
            raise RuntimeError(f"the counted turn ended {delivery.outcome}: {delivery.detail}")
        return dict(counts)
    finally:
        runtime.close()


def _sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def one_statement(url: str, reps: int) -> dict[str, list[float]]:
    """µs per find_turn: ours, SQLAlchemy Core in autocommit, SQLAlchemy BEGIN/COMMIT."""
    from sqlalchemy import create_engine, text

    runtime = Runtime(Settings(database_url=url))
    turn_id = runtime.journal.create_turn("one-statement", "hi").turn_id
    source = query("find_turn").sql.replace("%(turn_id)s", ":turn_id")
    statement = text(source)
    engine = create_engine(_sqlalchemy_url(url))
    kept = engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def timed(one: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(STATEMENTS_PER_REP):
                one()
            return (time.perf_counter() - started) * 1e6 / STATEMENTS_PER_REP

        return run

    def ours() -> object:
        return runtime.journal.find_turn(turn_id)

    def core_autocommit() -> object:
        return kept.execute(statement, {"turn_id": turn_id}).mappings().one()

    def core_transaction() -> object:
        with engine.begin() as conn:
            return conn.execute(statement, {"turn_id": turn_id}).mappings().one()

    samples: dict[str, list[float]] = {"ours": [], "core_autocommit": [], "core_begin": []}
    try:
        for _ in range(reps + 1):  # the first round warms plans and pools, then is dropped
            for name, one in (
                ("ours", ours),
                ("core_autocommit", core_autocommit),
                ("core_begin", core_transaction),
            ):
                samples[name].append(timed(one)())
    finally:
        kept.close()
        engine.dispose()
        runtime.close()
    return {name: values[1:] for name, values in samples.items()}


def import_cost(reps: int) -> dict[str, list[float]]:
    """In a fresh process: ms and MB (resident) to import the worker, then what importing
    SQLAlchemy's ORM on top of it adds."""
    probe = (
        "import time\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS:'): return int(line.split()[1]) / 1024\n"
        "r0, t0 = rss(), time.perf_counter()\n"
        "import durable_agent.tasks\n"
        "r1, t1 = rss(), time.perf_counter()\n"
        "import sqlalchemy.orm\n"
        "r2, t2 = rss(), time.perf_counter()\n"
        "print((t1 - t0) * 1e3, r1 - r0, (t2 - t1) * 1e3, r2 - r1)\n"
    )
    found: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(reps):
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
        worker_ms, worker_mb, orm_ms, orm_mb = map(float, result.stdout.split())
        found["worker ms"].append(worker_ms)
        found["worker MB"].append(worker_mb)
        found["sqlalchemy.orm ms"].append(orm_ms)
        found["sqlalchemy.orm MB"].append(orm_mb)
    return dict(found)


def start_costs(settings: Settings, reps: int) -> dict[str, Any]:
    """A start on our connection against one in the application's Session transaction."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(_sqlalchemy_url(settings.database_url))
    runtime = Runtime(settings)
    plain: list[float] = []
    in_transaction: list[float] = []
    commit: list[float] = []
    counts: collections.Counter[str] = collections.Counter()
    try:

        def ours() -> float:
            started = time.perf_counter()
            runtime.start_turn(f"plain-{uuid.uuid4().hex[:8]}", "hi")
            return (time.perf_counter() - started) * 1e3

        def theirs() -> float:
            with Session(engine) as session:
                session.connection()  # the application's transaction is open already
                started = time.perf_counter()
                runtime.start_turn(f"tx-{uuid.uuid4().hex[:8]}", "hi", connection=session)
                inside = time.perf_counter()
                session.commit()
                done = time.perf_counter()
            commit.append((done - inside) * 1e3)
            return (inside - started) * 1e3

        plain, in_transaction = interleaved(ours, theirs, reps=reps, warmup=3)
        commit[:] = commit[3:]
        with Session(engine) as session, _counting() as counts:
            runtime.start_turn("counted", "hi", connection=session)
            inside = sum(counts.values())
            session.commit()
    finally:
        runtime.close()
        engine.dispose()
    return {
        "plain_ms": plain,
        "in_transaction_ms": in_transaction,
        "commit_with_doorbell_ms": commit,
        "our_statements_after_commit": sum(counts.values()) - inside,
    }


def psycopg_doorbell(settings: Settings, samples: int) -> list[float]:
    """Seconds from the commit of a turn started on a psycopg connection until the sweeper
    (default interval and grace, running in this process) sent it."""
    default = Settings()
    settings = settings.model_copy(
        update={
            "sweep_interval_seconds": default.sweep_interval_seconds,
            "requeue_after_seconds": default.requeue_after_seconds,
        }
    )
    runtime = Runtime(settings)
    sweeper = SweeperThread(runtime.sweeper())
    sweeper.start()
    waited: list[float] = []
    try:
        with psycopg.connect(settings.database_url) as conn:
            for _ in range(samples):
                turn_id = start_turn(
                    f"door-{uuid.uuid4().hex[:8]}", "hi", settings=settings, connection=conn
                )
                conn.commit()
                committed = time.monotonic()
                deadline = committed + 60
                while runtime.journal.get_turn(turn_id).message_id is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the sweeper did not send the turn within 60 s")
                    time.sleep(0.01)
                waited.append(time.monotonic() - committed)
    finally:
        sweeper.stop()
        runtime.close()
    return waited


def run(*, reps: int = 5) -> dict[str, Any]:
    queue = f"bench-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(REDIS_URL)
    results: dict[str, Any] = {}
    with (
        scratch_database() as url,
        ScriptedModelServer(email_policy) as model,
        SmtpInbox() as inbox,
    ):
        settings = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=queue,
            openai_base_url=model.base_url,
            openai_api_key="bench",
        )
        with _environment({"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url}):
            try:
                results["turn_statements"] = statements_of_a_turn(settings)
                results["one_statement_us"] = one_statement(url, reps)
                results["import"] = import_cost(reps)
                results["start"] = start_costs(settings, reps * 4)
                results["psycopg_doorbell_s"] = psycopg_doorbell(settings, max(2, reps // 2))
            finally:
                with contextlib.suppress(redis.RedisError):
                    forget_queue(client, queue)
                client.close()
    _print(results)
    return results


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    import os

    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _print(results: dict[str, Any]) -> None:
    counts: dict[str, int] = results["turn_statements"]
    table = Table(title=f"One five-call turn: {sum(counts.values())} statements")
    table.add_column("query")
    table.add_column("times", justify="right")
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        table.add_row(name, str(count))
    out.print(table)

    one = results["one_statement_us"]
    table = Table(title="find_turn, µs per statement (medians, min-max)")
    for column in ("ours (prepared, kept)", "SQLAlchemy Core, autocommit", "SQLAlchemy, BEGIN"):
        table.add_column(column, justify="right")
    table.add_row(
        *(
            f"{_median(one[key]):.0f} ({spread(one[key])})"
            for key in ("ours", "core_autocommit", "core_begin")
        )
    )
    out.print(table)

    imports = results["import"]
    table = Table(title="Import in a fresh process (medians)")
    for column in ("durable_agent.tasks", "then sqlalchemy.orm adds"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{_median(imports['worker ms']):.0f} ms, {_median(imports['worker MB']):.1f} MB",
        f"{_median(imports['sqlalchemy.orm ms']):.0f} ms, "
        f"{_median(imports['sqlalchemy.orm MB']):.1f} MB",
    )
    out.print(table)

    start = results["start"]
    out.print(
        f"start_turn: {_median(start['plain_ms']):.2f} ms on our connection (insert, mark, "
        f"publish); {_median(start['in_transaction_ms']):.2f} ms in the application's "
        f"transaction, then {_median(start['commit_with_doorbell_ms']):.2f} ms for its commit "
        f"with the doorbell ({start['our_statements_after_commit']} statement(s) of ours and "
        "the publish)"
    )
    waited = results["psycopg_doorbell_s"]
    out.print(
        f"psycopg connection: the sweeper sent the turn {_median(waited):.1f} s after the "
        f"commit (min {min(waited):.1f}, max {max(waited):.1f}, {len(waited)} turns)"
    )
