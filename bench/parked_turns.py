"""Parked turns: many sleeping turns on one worker, and how fast an event or a child's end
reaches the turn that waits for it.

* **Sleepers.** One ``durable-agent worker`` (prefork, two children, the default sweep
  interval of 1 s). The rate of short turns (``quick``) on the idle worker, before the
  sleepers and again once every one is done (the median of the two); ``sleepers`` turns
  start and sleep ``sleep_seconds`` each; once all are parked, Redis is asked for their
  messages (there should be none: a parked turn has no message) and the same short turns
  run twice while they sleep (the median of the two, against the idle one). Then every
  sleeper must end ``done``, once (one wait step, claimed twice: before and after the
  sleep). Per sleeper: how late it was woken (the sweeper's send, ``enqueued_at``, minus the
  due time written in the wait step's intent) and how late it resumed (the wait step's
  outcome) -- Postgres's clock on both sides.
* **Event to waiting turn / child end to parent.** On the idle worker, one at a time: a
  turn parks waiting for ``go``; ``send_event`` is called; the time from the event's row
  (``sent_at``) to the wait step's outcome. A parent asks ``echo`` (a child turn); the time
  from the child's end (``finished_at``) to the parent's wait step's outcome. Both by
  Postgres's clock, woken through LISTEN/NOTIFY and the waker, not the sweeper.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import redis
from rich.table import Table

from durable_agent import send_event
from durable_agent.cli.console import out
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing.harness import WorkerProcess, forget_queue, settings_env, wait_until

from . import REDIS_URL, scratch_database

ROOT = Path(__file__).resolve().parents[1]
GOAL_LATENCY_MS = 50.0


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class _Bench:
    def __init__(self, url: str, logs: Path, sleep_seconds: float) -> None:
        self.settings = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=f"bench-waits-{uuid.uuid4().hex[:8]}",
            agents="bench.wait_agents",
            tools="durable_agent_examples.email_tools",  # a worker needs tools; none is called
            openai_base_url="http://127.0.0.1:9/v1",
            openai_api_key="bench",
        )
        self.runtime = Runtime(self.settings)
        self.pg = psycopg.connect(url, autocommit=True)
        self.redis = redis.Redis.from_url(REDIS_URL)
        env = {
            **settings_env(self.settings),
            "PYTHONPATH": str(ROOT),
            "BENCH_SLEEP_SECONDS": str(sleep_seconds),
        }
        self.worker = WorkerProcess(env, logs / "worker.log", pool="prefork", concurrency=2)

    def count(self, sql: str, *args: Any) -> int:
        row = self.pg.execute(sql, args).fetchone()
        return int(row[0]) if row else 0

    def quick_rate(self, turns: int) -> float:
        run = uuid.uuid4().hex[:8]
        started = time.perf_counter()
        for n in range(turns):
            self.runtime.start_turn(f"q-{run}-{n}", "hi", agent="quick")
        wait_until(
            lambda: (
                self.count(
                    "SELECT count(*) FROM turns WHERE session_id LIKE %s AND status = 'done'",
                    f"q-{run}-%",
                )
                >= turns
            ),
            300,
            "the short turns",
            interval=0.01,
        )
        return turns / (time.perf_counter() - started)

    def messages_in_redis(self) -> int:
        queued = int(self.redis.llen(self.settings.queue))
        unacked = sum(
            1 for _, payload in self.redis.hscan_iter("unacked")
            if self.settings.queue.encode() in payload
        )  # fmt: skip
        return queued + unacked

    def close(self) -> None:
        self.worker.stop(timeout=10)
        forget_queue(self.redis, self.settings.queue)
        self.redis.close()
        self.pg.close()
        self.runtime.close()


def _sleepers(bench: _Bench, sleepers: int, quick_turns: int) -> dict[str, Any]:
    idle = [bench.quick_rate(quick_turns)]
    run = uuid.uuid4().hex[:8]
    for n in range(sleepers):
        bench.runtime.start_turn(f"z-{run}-{n}", "sleep", agent="sleeper")
    like = f"z-{run}-%"

    def count(status: str) -> int:
        return bench.count(
            "SELECT count(*) FROM turns WHERE session_id LIKE %s AND status = %s", like, status
        )

    wait_until(lambda: count("waiting") >= sleepers, 600, "every sleeper parked", interval=0.05)
    messages = bench.messages_in_redis()
    busy = [bench.quick_rate(quick_turns), bench.quick_rate(quick_turns)]
    parked_during = count("waiting")  # all of them still: the rates were measured meanwhile
    wait_until(lambda: count("done") >= sleepers, 900, "every sleeper done", interval=0.1)
    idle.append(bench.quick_rate(quick_turns))  # idle again, after
    rows = bench.pg.execute(
        "SELECT t.status, t.attempts, t.enqueued_at, j.finished_at,"
        " (j.input ->> 'until')::timestamptz AS until,"
        " (SELECT count(*) FROM journal AS k WHERE k.turn_id = t.turn_id) AS steps"
        " FROM turns AS t JOIN journal AS j ON j.turn_id = t.turn_id AND j.step = 0"
        " WHERE t.session_id LIKE %s",
        (like,),
    ).fetchall()
    woken = [(enq - until).total_seconds() for _, _, enq, _, until, _ in rows]
    resumed = [(fin - until).total_seconds() for _, _, _, fin, until, _ in rows]
    once = sum(1 for st, att, _, _, _, steps in rows if st == "done" and att == 2 and steps == 1)
    idle_rate, busy_rate = statistics.median(idle), statistics.median(busy)
    return {
        "sleepers": sleepers,
        "idle_quick_turns_per_s": idle_rate,
        "quick_turns_per_s_while_sleeping": busy_rate,
        "idle_rates": idle,
        "rates_while_sleeping": busy,
        "rate_ratio": busy_rate / idle_rate,
        "parked_while_measured": parked_during,
        "messages_in_redis_while_parked": messages,
        "done_once": once,
        "woken_late_s": {
            "p50": _pct(woken, 0.5), "p99": _pct(woken, 0.99), "max": max(woken),
        },
        "resumed_late_s": {
            "p50": _pct(resumed, 0.5), "p99": _pct(resumed, 0.99), "max": max(resumed),
        },
    }  # fmt: skip


def _event_latency(bench: _Bench, samples: int) -> list[float]:
    found: list[float] = []
    for n in range(samples):
        turn_id = bench.runtime.start_turn(f"e-{uuid.uuid4().hex[:8]}-{n}", "go?", agent="waiter")
        wait_until(
            lambda: bench.runtime.journal.get_turn(turn_id).status == "waiting",  # noqa: B023
            30, "the waiter to park", interval=0.005,
        )  # fmt: skip
        send_event(turn_id, "go", {"n": n}, event_id=f"go-{n}", settings=bench.settings)
        wait_until(
            lambda: bench.runtime.journal.get_turn(turn_id).finished,  # noqa: B023
            30, "the waiter to end", interval=0.005,
        )  # fmt: skip
        row = bench.pg.execute(
            "SELECT (SELECT finished_at FROM journal WHERE turn_id = %s AND step = 0)"
            " - (SELECT sent_at FROM events WHERE turn_id = %s)",
            (turn_id, turn_id),
        ).fetchone()
        assert row is not None
        found.append(row[0].total_seconds() * 1e3)
    return found


def _child_latency(bench: _Bench, samples: int) -> list[float]:
    found: list[float] = []
    for n in range(samples):
        parent = bench.runtime.start_turn(f"c-{uuid.uuid4().hex[:8]}-{n}", f"ping {n}",
                                          agent="delegator")  # fmt: skip
        wait_until(
            lambda: bench.runtime.journal.get_turn(parent).finished,  # noqa: B023
            30, "the parent to end", interval=0.005,
        )  # fmt: skip
        row = bench.pg.execute(
            "SELECT j.finished_at - c.finished_at FROM journal AS j"
            " JOIN child_turns AS l ON l.parent_turn_id = j.turn_id AND l.parent_step = j.step"
            " JOIN turns AS c ON c.turn_id = l.turn_id WHERE j.turn_id = %s AND j.step = 0",
            (parent,),
        ).fetchone()
        assert row is not None
        found.append(row[0].total_seconds() * 1e3)
    return found


def run(
    *, sleepers: int = 1000, sleep_seconds: float = 30.0, quick_turns: int = 300, samples: int = 30
) -> dict[str, Any]:
    with scratch_database() as url, tempfile.TemporaryDirectory(prefix="bench-waits-") as logs:
        bench = _Bench(url, Path(logs), sleep_seconds)
        try:
            bench.worker.start()
            bench.worker.wait_ready(60)
            bench.quick_rate(20)  # warm-up
            events = _event_latency(bench, samples)
            children = _child_latency(bench, samples)
            sleeping = _sleepers(bench, sleepers, quick_turns)
        finally:
            bench.close()
    result = {
        "sleep": {**sleeping, "sleep_seconds": sleep_seconds, "sweep_interval_seconds": 1.0},
        "event_to_turn_ms": events,
        "child_end_to_parent_ms": children,
        "goal_latency_ms": GOAL_LATENCY_MS,
    }
    table = Table(title=f"Parked turns: {sleepers} sleeping {sleep_seconds:g} s on one worker")
    table.add_column("measure")
    table.add_column("value", justify="right")
    s = sleeping
    idle, busy = s["idle_quick_turns_per_s"], s["quick_turns_per_s_while_sleeping"]
    table.add_row(
        "short turns/s, idle -> while they sleep",
        f"{idle:.1f} -> {busy:.1f} ({s['rate_ratio']:.2f}x)",
    )
    table.add_row(
        "messages in Redis for the parked turns", str(s["messages_in_redis_while_parked"])
    )
    table.add_row("woken after the due time, p50 / p99 / max",
                  "{p50:.2f} / {p99:.2f} / {max:.2f} s".format(**s["woken_late_s"]))  # fmt: skip
    table.add_row("resumed after the due time, p50 / p99 / max",
                  "{p50:.2f} / {p99:.2f} / {max:.2f} s".format(**s["resumed_late_s"]))  # fmt: skip
    table.add_row("done once", f"{s['done_once']} of {sleepers}")
    table.add_row("event -> waiting turn, median / p99",
                  f"{statistics.median(events):.1f} / {_pct(events, 0.99):.1f} ms")  # fmt: skip
    table.add_row("child end -> parent, median / p99",
                  f"{statistics.median(children):.1f} / {_pct(children, 0.99):.1f} ms")  # fmt: skip
    out.print(table)
    return result
