"""Shared fixtures: one fresh database per test (cloned from a migrated template), a unique
queue per test on the local Redis, and real worker processes cleaned up by PID.

Postgres and Redis are found from ``DURABLE_AGENT_TEST_POSTGRES`` (default
``postgresql://root@127.0.0.1:5432/postgres``) and ``DURABLE_AGENT_TEST_REDIS`` (default
``redis://127.0.0.1:6379/0``). Unit tests need neither.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from durable_agent.embedded import EmbeddedServices, postgres_binaries, redis_server_binary
from durable_agent.journal import Database, JournalStore, Leases, migrate
from durable_agent.runtime import Runtime, close_runtimes
from durable_agent.settings import Settings
from durable_agent.testing.harness import WorkerProcess, forget_queue, settings_env

ADMIN_URL = os.environ.get(
    "DURABLE_AGENT_TEST_POSTGRES", "postgresql://root@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("DURABLE_AGENT_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _database_url(dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_URL)
    user = info.get("user", "root")
    host = info.get("host", "127.0.0.1")
    port = info.get("port", 5432)
    return f"postgresql://{user}@{host}:{port}/{dbname}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by its directory, so `pytest -m "not acceptance"` skips the layer that
    starts worker processes and `-m "not integration and not acceptance"` needs no services.

    Tests marked ``long`` run first: handed out in order (``--dist load``), they start at
    once on different pytest workers instead of ending the run alone."""
    for item in items:
        layer = item.path.parent.name
        if layer in ("integration", "acceptance"):
            item.add_marker(layer)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable


def embedded_available() -> bool:
    return postgres_binaries() is not None and redis_server_binary() is not None


def _admin() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)


def _postgres_error() -> str | None:
    try:
        with _admin() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as error:
        return str(error).strip().splitlines()[0]
    return None


def _redis_error() -> str | None:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        return str(error)
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def services_available(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Postgres and Redis for the run: the configured or local ones; where none is configured
    and the local one is down, the embedded servers of ``durable-agent demo``; otherwise stop
    the run with one clear line saying which is missing."""
    global ADMIN_URL, REDIS_URL
    pg_error, redis_error = _postgres_error(), _redis_error()
    configured = {"DURABLE_AGENT_TEST_POSTGRES", "DURABLE_AGENT_TEST_REDIS"} & set(os.environ)
    embedded = None
    if (pg_error or redis_error) and not configured and embedded_available():
        embedded = EmbeddedServices(
            tmp_path_factory.mktemp("embedded"), postgres=bool(pg_error), redis=bool(redis_error)
        )
        embedded.start()
        if pg_error:
            ADMIN_URL = embedded.database_url.rsplit("/", 1)[0] + "/postgres"
            pg_error = None
        if redis_error:
            REDIS_URL, redis_error = embedded.broker_url, None
    if pg_error:
        pytest.exit(
            f"Postgres is not reachable at {ADMIN_URL} ({pg_error}). "
            "Start it, or point DURABLE_AGENT_TEST_POSTGRES at one.",
            returncode=3,
        )
    if redis_error:
        pytest.exit(
            f"Redis is not reachable at {REDIS_URL} ({redis_error}). "
            "Start it, or point DURABLE_AGENT_TEST_REDIS at one.",
            returncode=3,
        )
    yield
    if embedded is not None:
        embedded.stop()


@contextmanager
def _scratch_database(prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database (empty, or cloned from ``template``), dropped afterwards; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clone = f' TEMPLATE "{template}"' if template else ""
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"{clone}')
    try:
        yield name
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_db(services_available: None) -> Iterator[str]:
    """One migrated database per run; each test's database is cloned from it."""
    with _scratch_database("da_template") as name:
        db = Database(_database_url(name))
        migrate(db)
        db.close()
        yield name


@pytest.fixture
def database_url(template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    with _scratch_database("da_test", template_db) as name:
        yield _database_url(name)


@pytest.fixture
def empty_database_url(services_available: None) -> Iterator[str]:
    """A fresh database with no tables (for migration tests)."""
    with _scratch_database("da_empty") as name:
        yield _database_url(name)


@pytest.fixture
def new_database(services_available: None) -> Iterator[Callable[[], str]]:
    """Make more empty databases for this test (dropped at its end); each call gives a URL."""
    with ExitStack() as stack:
        yield lambda: _database_url(stack.enter_context(_scratch_database("da_extra")))


@pytest.fixture
def settings(database_url: str) -> Iterator[Settings]:
    """Settings for this test: its own database and its own queue (removed from Redis
    afterwards, with any unacked copies); short leases."""
    test_settings = Settings(
        database_url=database_url,
        broker_url=REDIS_URL,
        queue=f"test-{uuid.uuid4().hex[:10]}",
        lease_seconds=3.0,
        sweep_interval_seconds=0.5,
        requeue_after_seconds=30.0,
        openai_base_url="http://127.0.0.1:9/v1",
        openai_api_key="test",
        model_max_retries=1,
        model_timeout_seconds=10.0,
    )
    yield test_settings
    close_runtimes()  # the ones start_turn(settings=...) and friends made
    client = redis.Redis.from_url(REDIS_URL)
    try:
        forget_queue(client, test_settings.queue)
    finally:
        client.close()


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    """The runtime of this test's settings (its database, queue, claims, sweeper)."""
    test_runtime = Runtime(settings)
    yield test_runtime
    test_runtime.close()


@pytest.fixture
def db(runtime: Runtime) -> Database:
    return runtime.database


@pytest.fixture
def store(db: Database) -> JournalStore:
    return JournalStore(db, blob_threshold=1024)


@pytest.fixture
def leases(runtime: Runtime) -> Leases:
    return runtime.leases


@pytest.fixture
def pg(database_url: str) -> Iterator[psycopg.Connection]:
    """A plain connection to this test's database, for SQL a test runs itself."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


class DatabaseClock:
    """Moves the clock of this test's database (``durable_agent_now()``) forward, so that a
    lease, a deferral or a grace period runs out without waiting for it."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.offset = 0.0

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        self.conn.execute(
            "CREATE OR REPLACE FUNCTION durable_agent_now() RETURNS timestamptz "
            "LANGUAGE sql STABLE PARALLEL SAFE "
            f"AS $$ SELECT now() + interval '{self.offset:.6f} seconds' $$"
        )


@pytest.fixture
def clock(pg: psycopg.Connection) -> DatabaseClock:
    return DatabaseClock(pg)


@pytest.fixture
def redis_client(services_available: None) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator:
    """Start real ``durable-agent worker`` processes; every one is stopped by PID at the end."""
    started: list[WorkerProcess] = []

    def start(
        settings: Settings,
        *,
        name: str | None = None,
        ready: bool = True,
        pool: str = "solo",
        concurrency: int = 1,
        **env: str,
    ) -> WorkerProcess:
        name = name or f"worker{len(started) + 1}"
        worker = WorkerProcess(
            {**settings_env(settings), **env},
            tmp_path / f"{name}.log",
            name=name,
            pool=pool,
            concurrency=concurrency,
        )
        started.append(worker)
        worker.start()
        if ready:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop(timeout=5)


@pytest.fixture
def durable_agent_settings(settings: Settings) -> Settings:
    """The pytest plugin's fixtures (crash_matrix, durable_workers) use this test's database,
    as a user points them at theirs."""
    return settings


USER_APP = Path(__file__).parent / "user_app"
"""A user's application (giftshop), written against the documented API only."""


@pytest.fixture
def user_app(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from the user's project folder, as its authors do: its modules importable here
    and in the workers the crash matrix starts (they get the current folder on their path)."""
    monkeypatch.chdir(USER_APP)
    monkeypatch.syspath_prepend(str(USER_APP))
    # its modules read the environment at import (the agents' queues): each test imports
    # them afresh, not as an earlier test in this process left them
    for name in [m for m in sys.modules if m == "giftshop" or m.startswith("giftshop.")]:
        monkeypatch.delitem(sys.modules, name)
    return USER_APP


@pytest.fixture
def otel_spans() -> Iterator[Any]:
    """The spans this process ends (it is the application, or an in-process worker), in an
    in-memory exporter emptied for each test; the process's tracer provider is set once."""
    pytest.importorskip("opentelemetry.sdk", reason="needs the 'otel' extra")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    global _SPANS
    if _SPANS is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _SPANS = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
    _SPANS.clear()
    yield _SPANS
    _SPANS.clear()


_SPANS: Any = None
