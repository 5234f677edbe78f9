"""The database handle of one process: an engine and one long-lived autocommit connection.

Journal writes are single statements, so they run in autocommit mode on one connection
that the process keeps, instead of a pool checkout plus BEGIN/COMMIT per statement
(``make bench`` measures the difference). Driver errors that mean "cannot reach Postgres" become
:class:`~durable_agent.errors.ServiceUnavailable`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, CursorResult, Engine, TextClause, create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from ..errors import ConfigurationError, ServiceUnavailable


def describe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return "<unparseable url>"


class Database:
    """An engine plus the one autocommit connection this process writes through."""

    def __init__(self, url: str) -> None:
        try:
            backend = make_url(url).get_backend_name()
        except sa_exc.ArgumentError as error:
            raise ConfigurationError(f"bad database URL {describe_url(url)}: {error}") from error
        if backend != "postgresql":
            raise ConfigurationError(
                f"bad database URL {describe_url(url)}: durable-agent needs PostgreSQL "
                "(postgresql://user@host:port/dbname)"
            )
        try:
            self.engine: Engine = create_engine(
                url,
                isolation_level="AUTOCOMMIT",
                pool_size=2,
                max_overflow=4,
                pool_pre_ping=True,
                connect_args={"connect_timeout": 5},
            )
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as error:
            # ImportError: a driver that is not installed, e.g. postgresql+psycopg2://
            raise ConfigurationError(f"bad database URL {describe_url(url)}: {error}") from error
        self.url = url
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _connection(self) -> Connection:
        if self._pid != os.getpid():  # forked: never share a socket with the parent
            self.engine.dispose(close=False)
            self._conn, self._pid = None, os.getpid()
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self.engine.connect()
        return self._conn

    def execute(
        self, statement: TextClause | Any, params: Mapping[str, Any] | None = None
    ) -> CursorResult[Any]:
        """Run one statement on the process's connection (autocommit).

        A connection that turns out to be dead (Postgres restarted since its last use) is
        replaced and the statement sent once more. That is safe for every statement we send:
        a write that did commit before the connection died is refused the second time by
        the primary key or the epoch fence, never applied twice.
        """
        with self._lock, translate_errors(self.url):
            for attempt in (1, 2):
                try:
                    return self._connection().execute(statement, dict(params or {}))
                except sa_exc.DBAPIError as error:
                    if not error.connection_invalidated:
                        raise
                    self._conn = None
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A separate connection with one transaction, for multi-statement work (migrations)."""
        with translate_errors(self.url):
            conn = self.engine.connect().execution_options(isolation_level="READ COMMITTED")
            try:
                with conn.begin():
                    yield conn
            finally:
                conn.close()

    @contextmanager
    def side_connection(self) -> Iterator[Connection]:
        """A pooled autocommit connection for another thread (the heartbeat)."""
        with translate_errors(self.url), self.engine.connect() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and not self._conn.closed:
                self._conn.close()
            self._conn = None
        self.engine.dispose()


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn 'cannot reach the database' driver errors into ServiceUnavailable."""
    try:
        yield
    except sa_exc.OperationalError as error:
        raise ServiceUnavailable(
            f"cannot reach Postgres at {describe_url(url)}: {_first_line(error.orig)}"
        ) from error
    except sa_exc.InterfaceError as error:
        raise ServiceUnavailable(
            f"lost the connection to Postgres at {describe_url(url)}: {_first_line(error.orig)}"
        ) from error


def _first_line(error: BaseException | None) -> str:
    text = str(error or "").strip()
    return text.splitlines()[0] if text else type(error).__name__


_databases: dict[str, Database] = {}
_databases_lock = threading.Lock()


def database_for(url: str) -> Database:
    """The process-wide Database for this URL (created on first use)."""
    with _databases_lock:
        db = _databases.get(url)
        if db is None:
            db = _databases[url] = Database(url)
        return db
