"""Benchmarks of durable-agent against the naive way, run side by side in one process.

The machine is shared and noisy, so nothing here is an absolute number to compare across
runs: every measurement that has a baseline runs the baseline and our code in alternating
repetitions (A B A B ...) and reports both medians and their ratio.

Each benchmark makes its own scratch database (``CREATE DATABASE bench_<random>`` on the
server of ``DURABLE_AGENT_TEST_POSTGRES``, default ``postgresql://root@127.0.0.1:5432/postgres``)
and drops it at the end; the recovery benchmark also uses its own Redis queue on
``DURABLE_AGENT_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from durable_agent.journal import Database, migrate

ADMIN_URL = os.environ.get(
    "DURABLE_AGENT_TEST_POSTGRES", "postgresql://root@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("DURABLE_AGENT_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _admin() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)


def _database_url(dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_URL)
    user = info.get("user", "root")
    host = info.get("host", "127.0.0.1")
    port = info.get("port", 5432)
    password = info.get("password")
    auth = f"{user}:{password}" if password else str(user)
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


@contextmanager
def scratch_database() -> Iterator[str]:
    """A fresh, migrated database for one benchmark; dropped (WITH (FORCE)) afterwards."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = _database_url(name)
        db = Database(url)
        try:
            migrate(db)
        finally:
            db.close()
        yield url
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class Machine:
    cpus: int
    python: str
    postgres: str

    def line(self) -> str:
        return f"machine: {self.cpus} CPUs · Python {self.python} · PostgreSQL {self.postgres}"

    def as_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "python": self.python, "postgres": self.postgres}


def machine() -> Machine:
    """nproc, the Python version and the Postgres server version."""
    with _admin() as conn:
        row = conn.execute("SHOW server_version").fetchone()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Machine(
        cpus=cpus or 1,
        python=platform.python_version(),
        postgres=str(row[0]) if row else "?",
    )


@dataclass(frozen=True)
class Comparison:
    """Medians of a baseline and of our code, measured in alternating repetitions."""

    name: str
    unit: str
    ours: list[float]
    baseline: list[float]

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline)

    @property
    def ratio(self) -> float:
        """How many times the baseline costs what ours costs (> 1: ours is cheaper)."""
        return self.baseline_median / self.ours_median

    def as_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "ours": {"median": self.ours_median, "samples": self.ours},
            "baseline": {"median": self.baseline_median, "samples": self.baseline},
            "ratio": self.ratio,
            "ratio_per_rep": [b / o for b, o in zip(self.baseline, self.ours, strict=True)],
        }


def interleaved(
    baseline: Callable[[], float],
    ours: Callable[[], float],
    *,
    reps: int,
    warmup: int = 1,
) -> tuple[list[float], list[float]]:
    """Run baseline and ours alternately (A B A B ...); each call returns its own measure.

    The first ``warmup`` pairs are discarded (connection set-up, plan caches).
    Returns (baseline samples, our samples).
    """
    for _ in range(warmup):
        baseline()
        ours()
    base_samples: list[float] = []
    our_samples: list[float] = []
    for _ in range(reps):
        base_samples.append(baseline())
        our_samples.append(ours())
    return base_samples, our_samples


def spread(samples: list[float], fmt: str = "{:.0f}") -> str:
    """'min-max' of the samples."""
    return f"{fmt.format(min(samples))}-{fmt.format(max(samples))}"


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self.seconds = 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds = time.perf_counter() - self._start
