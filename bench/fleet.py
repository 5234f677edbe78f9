"""A fleet, not one worker: many prefork slots waiting on a slow model, ours beside the bare task.

Real agents wait on the model most of the time, so a fleet runs many slots per core. Here the
scripted model answers each request after ``model_ms`` (200 ms by default), the turn is the
throughput benchmark's (three model calls, ``lookup_note``, ``send_email`` over SMTP), and
each configuration runs ``workers`` prefork workers of ``slots`` children each, on both
sides, rounds alternating (bare, ours, ...). A round submits ``turns`` turns at once and
measures turns/s from the first submit to the last end, the latency of each turn (recorded
to ended), and the CPU the Postgres server's processes used during the round, per step
(``/proc``; the server must run on this machine, as it does here; other users of the
server add to it). The same is run with group commit on (``commit_delay`` and
``commit_siblings`` set on the benchmark's database), which lets concurrent commits share
one WAL flush.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, wait_until

from . import ADMIN_URL, scratch_database
from .throughput import MESSAGE, Bench

STEPS_PER_TURN = 5  # model, lookup_note, model, send_email, model


def postgres_cpu_seconds() -> float:
    """User and system CPU of every process named postgres on this machine, so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)
            if "(postgres" not in fields[0]:
                continue
            parts = fields[1].split()
            total += int(parts[11]) + int(parts[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


@dataclass
class Round:
    turns_per_s: float
    latency_ms: list[float]
    postgres_cpu_ms_per_step: float


@dataclass
class Config:
    workers: int
    slots: int
    group_commit: bool
    ours: list[Round] = field(default_factory=list)
    bare: list[Round] = field(default_factory=list)

    def median(self, side: str) -> float:
        return statistics.median(r.turns_per_s for r in getattr(self, side))

    def latencies(self, side: str) -> list[float]:
        return sorted(ms for r in getattr(self, side) for ms in r.latency_ms)

    def as_json(self) -> dict[str, Any]:
        def side(name: str) -> dict[str, Any]:
            rounds: list[Round] = getattr(self, name)
            lat = self.latencies(name)
            return {
                "turns_per_s": [r.turns_per_s for r in rounds],
                "latency_ms": {"p50": _pct(lat, 50), "p90": _pct(lat, 90), "p99": _pct(lat, 99)},
                "postgres_cpu_ms_per_step": [r.postgres_cpu_ms_per_step for r in rounds],
            }

        return {
            "workers": self.workers,
            "slots_per_worker": self.slots,
            "group_commit": self.group_commit,
            "ours": side("ours"),
            "bare": side("bare"),
            "ratio": self.median("ours") / self.median("bare"),
        }


def _pct(samples: list[float], pct: int) -> float:
    if not samples:
        return 0.0
    return samples[min(len(samples) - 1, round(pct / 100 * (len(samples) - 1)))]


class FleetBench(Bench):
    def start_fleet(self, side: str, workers: int, slots: int) -> list[WorkerProcess]:
        from durable_agent.testing.harness import settings_env

        from .throughput import ROOT, BareWorker

        settings = self.ours if side == "ours" else self.bare
        env = {**settings_env(settings), **self.servers, "PYTHONPATH": str(ROOT)}
        kind = WorkerProcess if side == "ours" else BareWorker
        started = [
            kind(env, self.logs / f"fleet-{side}-{n}.log", pool="prefork", concurrency=slots,
                 name=f"fleet-{side}{n}")
            for n in range(workers)
        ]  # fmt: skip
        for worker in started:
            worker.start()
        for worker in started:
            worker.wait_ready(120)
        return started

    def fleet_round_ours(self, turns: int) -> Round:
        run = uuid.uuid4().hex[:8]
        cpu = postgres_cpu_seconds()
        started = time.perf_counter()
        for n in range(turns):
            self.runtime.start_turn(f"bench-{run}-{n}", MESSAGE)
        wait_until(lambda: self._done(run) >= turns, 600, f"{turns} turns", interval=0.05)
        elapsed = time.perf_counter() - started
        cpu = postgres_cpu_seconds() - cpu
        rows = self.pg.execute(
            "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM turns "
            "WHERE session_id LIKE %s",
            (f"bench-{run}-%",),
        ).fetchall()
        return Round(
            turns / elapsed, [float(r[0]) for r in rows], cpu * 1e3 / (turns * STEPS_PER_TURN)
        )

    def fleet_round_bare(self, turns: int) -> Round:
        run = uuid.uuid4().hex[:8]
        app = self.bare_app()
        cpu = postgres_cpu_seconds()
        sent: dict[str, float] = {}
        started = time.perf_counter()
        for n in range(turns):
            session = f"bench-{run}-{n}"
            sent[session] = time.time()
            app.send_task("bench.bare_turn", args=(session, MESSAGE, run))
        wait_until(
            lambda: int(self.redis.get(f"bench:bare:{run}") or 0) >= turns,
            600,
            f"{turns} bare turns",
            interval=0.05,
        )
        elapsed = time.perf_counter() - started
        cpu = postgres_cpu_seconds() - cpu
        ended = self.redis.hgetall(f"bench:bare:{run}:ended")
        latency = [
            (float(at) - sent[session.decode()]) * 1e3 for session, at in ended.items()
        ]  # fmt: skip
        return Round(turns / elapsed, latency, cpu * 1e3 / (turns * STEPS_PER_TURN))


CONFIGS = [(2, 16), (4, 16)]  # workers, prefork slots each: 32 and 64 slots


def run(
    *,
    rounds: int = 2,
    turns_per_slot: int = 3,
    model_ms: float = 200.0,
    configs: list[tuple[int, int]] | None = None,
    group_commit: tuple[bool, ...] = (False, True),
) -> dict[str, Any]:
    results: list[Config] = []
    for grouped in group_commit:
        with (
            scratch_database() as url,
            tempfile.TemporaryDirectory(prefix="bench-fleet-") as logs,
            ScriptedModelServer(email_policy) as model,
            SmtpInbox() as inbox,
        ):
            model.delay_seconds = model_ms / 1e3
            if grouped:
                name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
                with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                    # commits of other sessions within 200 µs share one WAL flush, when at
                    # least 5 other transactions are open
                    admin.execute(f'ALTER DATABASE "{name}" SET commit_delay = 200')
                    admin.execute(f'ALTER DATABASE "{name}" SET commit_siblings = 5')
            # like with like: the bare task does not stream, so ours does not either here
            bench = FleetBench(url, Path(logs), model, inbox, stream=False)
            try:
                for workers, slots in configs or CONFIGS:
                    config = Config(workers, slots, grouped)
                    fleet = bench.start_fleet("bare", workers, slots) + bench.start_fleet(
                        "ours", workers, slots
                    )
                    turns = turns_per_slot * workers * slots
                    try:
                        bench.fleet_round_bare(workers * slots)  # warm-up
                        bench.fleet_round_ours(workers * slots)
                        for _ in range(rounds):
                            config.bare.append(bench.fleet_round_bare(turns))
                            config.ours.append(bench.fleet_round_ours(turns))
                    finally:
                        for worker in fleet:
                            worker.stop(timeout=30)
                    inbox.clear()
                    results.append(config)
            finally:
                bench.close()
    _print(results, model_ms)
    return {"model_ms": model_ms, "fleet": [c.as_json() for c in results]}


def _print(results: list[Config], model_ms: float) -> None:
    table = Table(title=f"A fleet of prefork slots, the model answering in {model_ms:.0f} ms")
    for column in ("workers x slots", "group commit", "durable-agent turns/s", "bare turns/s",
                   "ours / bare", "ours p50/p99 ms", "bare p50/p99 ms",
                   "Postgres CPU ms/step"):  # fmt: skip
        table.add_column(column, justify="right")
    for c in results:
        lo, lb = c.latencies("ours"), c.latencies("bare")
        cpu = statistics.median(r.postgres_cpu_ms_per_step for r in c.ours)
        table.add_row(
            f"{c.workers} x {c.slots}",
            "on" if c.group_commit else "off",
            f"{c.median('ours'):.1f}",
            f"{c.median('bare'):.1f}",
            f"{c.median('ours') / c.median('bare'):.2f}x",
            f"{_pct(lo, 50):.0f} / {_pct(lo, 99):.0f}",
            f"{_pct(lb, 50):.0f} / {_pct(lb, 99):.0f}",
            f"{cpu:.3f}",
        )
    out.print(table)
