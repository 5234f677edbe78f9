"""The database handle of one process: named queries on one long-lived autocommit connection.

Journal writes are single statements, so they run in autocommit mode on one connection that
the process keeps (``make bench`` measures it against a pool checkout and BEGIN/COMMIT per
statement), as server-side prepared statements through psycopg 3. Multi-statement work
(a sweeper pass, migrations) runs in a transaction on a second connection.

Nothing here crosses a fork: a child process (a prefork pool's worker) starts with no
connection and fresh locks, and opens its own on first use. The parent's sockets are left
alone (psycopg never closes a connection another process opened).

Driver errors that mean "cannot reach Postgres" become
:class:`~durable_agent.errors.ServiceUnavailable`; a connection found dead is replaced and its
statement sent once more.

Every row passes through the process's :class:`~.sealing.Sealer` on its way out: sealed
payload columns are opened here, the one place reads go through.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import JsonbLoader

from ..errors import ConfigurationError, InvalidArgument, ServiceUnavailable
from .queries import Query, query
from .sealing import NO_SEALING, Sealer, load_jsonb

Row = dict[str, Any]
T = TypeVar("T")

_SCHEMES = ("postgresql", "postgres")


def describe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparseable url>"


def conninfo_for(url: str) -> str:
    """The libpq connection string for a ``postgresql://`` URL; ConfigurationError if bad.

    A driver named after the scheme, as SQLAlchemy spells URLs (``postgresql+psycopg://``),
    is accepted and ignored: durable-agent always talks to Postgres through psycopg 3.
    """
    shown = describe_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower().partition("+")[0] not in _SCHEMES:
        raise ConfigurationError(
            f"bad database URL {shown}: durable-agent needs PostgreSQL, "
            "e.g. postgresql://user@host:5432/dbname"
        )
    conninfo = "postgresql://" + rest
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as error:
        raise ConfigurationError(f"bad database URL {shown}: {_first_line(error)}") from error
    for port in str(params.get("port") or "5432").split(","):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"bad database URL {shown}: port {port!r} is not a port")
    for name, allowed in _CHOICES.items():
        value = params.get(name)
        if value is not None and str(value) not in allowed:
            # libpq would refuse it only when it connects, where it reads as an outage
            raise ConfigurationError(
                f"bad database URL {shown}: {name}={value!r} is not one of {', '.join(allowed)}"
            )
    return conninfo


_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
}
"""The libpq parameters that take one of a few words: a bad one is a configuration error."""


class _Connected:
    """Runs named queries on one psycopg connection.

    Our own connections prepare every statement on the server (``prepare=True``); on a
    connection the application lends us (``prepare=None``) psycopg's own setting decides, so
    an application behind a transaction-mode pooler that turned preparing off keeps it off.
    Rows are dicts whatever the connection's row factory is.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        prepare: bool | None = True,
        sealer: Sealer = NO_SEALING,
    ) -> None:
        self.conn = conn
        self.prepare = prepare
        self.sealer = sealer

    def run(self, name: str, /, **params: Any) -> list[Row]:
        """Every row the query returns ([] for a statement that returns none)."""
        return _run(self.conn, query(name), params, prepare=self.prepare, sealer=self.sealer)

    def one(self, name: str, /, **params: Any) -> Row | None:
        rows = self.run(name, **params)
        return rows[0] if rows else None

    def value(self, name: str, /, **params: Any) -> Any:
        row = self.one(name, **params)
        return next(iter(row.values())) if row else None

    def script(self, sql: str) -> None:
        """Several statements with no parameters (a migration)."""
        self.conn.execute(sql.encode(), prepare=False)


def on_connection(conn: psycopg.Connection[Any], sealer: Sealer = NO_SEALING) -> _Connected:
    """Named queries on a connection the application lends us, in its transaction."""
    return _Connected(conn, prepare=None, sealer=sealer)


def _run(
    conn: psycopg.Connection[Any],
    q: Query,
    params: dict[str, Any],
    make: Callable[..., Any] | None = None,
    *,
    prepare: bool | None = True,
    sealer: Sealer = NO_SEALING,
    mark: bool = False,
) -> list[Any]:
    if params.keys() != q.parameters:
        raise TypeError(f"query {q.name} takes {sorted(q.parameters)}, got {sorted(params)}")
    try:
        if make is None:
            cursor: psycopg.Cursor[Any] = conn.cursor(row_factory=dict_row)
        else:  # each row into make(*columns): no dict per row
            cursor = conn.cursor(row_factory=tuple_row)
        cursor.execute(q.sql, params, prepare=prepare)
    except (psycopg.DataError, psycopg.errors.ProgramLimitExceeded, UnicodeEncodeError) as error:
        # a value Postgres cannot take (too long for an index, not encodable...): the
        # caller's to fix, and retrying cannot help
        raise InvalidArgument(
            f"Postgres refused a value in {q.name}: {_first_line(error)}"
        ) from error
    if not cursor.description:
        return []
    rows: list[Any] = cursor.fetchall()
    names = [column.name for column in cursor.description]
    if make is None:
        sealer.open_rows(q.name, names, rows, mark=mark)
        return rows
    sealer.open_rows(q.name, names, rows)
    return [make(*row) for row in rows]


class _JsonbLoader(JsonbLoader):
    """jsonb, with a sealed value read as its token (:func:`~.sealing.load_jsonb`)."""

    _loads = staticmethod(load_jsonb)


class Database:
    """The process's connections to one Postgres database."""

    def __init__(
        self, url: str, *, connect_timeout: float = 5.0, sealer: Sealer = NO_SEALING
    ) -> None:
        self.url = url
        self.sealer = sealer
        self.conninfo = conninfo_for(url)
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Row] | None = None
        self._tx_conn: psycopg.Connection[Row] | None = None
        self._lock = threading.Lock()
        self._tx_lock = threading.Lock()
        _live.add(self)

    # -- connections ----------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Row]:
        conn = self._open_connection()
        # a sealed jsonb value is read as its token, not parsed (opened in _run)
        conn.adapters.register_loader("jsonb", _JsonbLoader)
        return conn

    def _open_connection(self) -> psycopg.Connection[Row]:
        try:
            return psycopg.connect(
                self.conninfo,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, round(self.connect_timeout)),
                application_name="durable-agent",
            )
        except psycopg.OperationalError as error:
            raise ServiceUnavailable(
                f"cannot reach Postgres at {describe_url(self.url)}: {_first_line(error)}"
            ) from error
        except psycopg.ProgrammingError as error:  # e.g. an option libpq rejects
            raise ConfigurationError(
                f"bad database URL {describe_url(self.url)}: {_first_line(error)}"
            ) from error

    def _after_fork_in_child(self) -> None:
        # The parent's connections and locks are not ours: drop them without closing the
        # sockets (the parent still uses them) and start from nothing.
        self._conn = self._tx_conn = None
        self._lock = threading.Lock()
        self._tx_lock = threading.Lock()

    # -- queries on the autocommit connection ---------------------------------------------

    def run(self, name: str, /, **params: Any) -> list[Row]:
        """Run one named query on the process's connection (autocommit); its rows.

        A connection that turns out to be dead (Postgres restarted since its last use) is
        replaced and the statement sent once more. That is safe for every statement we send:
        a write that did commit before the connection died is refused the second time by
        the primary key or the epoch fence, never applied twice.
        """
        rows: list[Row] = self._send(query(name), params, None)
        return rows

    def run_marked(self, name: str, /, **params: Any) -> list[Row]:
        """Like :meth:`run`, for a listing: a payload that does not open (a key this
        process lacks, a tampered value) comes back as None, marked in the row's
        ``unreadable`` list (:class:`~.sealing.Unreadable`), instead of failing the query."""
        rows: list[Row] = self._send(query(name), params, None, mark=True)
        return rows

    def one_marked(self, name: str, /, **params: Any) -> Row | None:
        rows = self.run_marked(name, **params)
        return rows[0] if rows else None

    def records(self, name: str, make: Callable[..., T], /, **params: Any) -> list[T]:
        """Like :meth:`run`, each row turned into ``make(*columns)`` (in the query's order)."""
        records: list[T] = self._send(query(name), params, make)
        return records

    def _send(
        self,
        q: Query,
        params: dict[str, Any],
        make: Callable[..., Any] | None,
        *,
        mark: bool = False,
    ) -> Any:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                conn = self._conn
                try:
                    return _run(conn, q, params, make, sealer=self.sealer, mark=mark)
                except psycopg.OperationalError as error:
                    translated = translate(error, self.url)
                    if conn.broken or isinstance(translated, ServiceUnavailable):
                        # a connection the server dropped (a restart, a crash, an admin):
                        # a new one may work, so the statement is sent once more
                        self._conn = None
                        if attempt == 1:
                            continue
                    raise translated from error
            raise AssertionError("unreachable")

    def one(self, name: str, /, **params: Any) -> Row | None:
        rows = self.run(name, **params)
        return rows[0] if rows else None

    def value(self, name: str, /, **params: Any) -> Any:
        row = self.one(name, **params)
        return next(iter(row.values())) if row else None

    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[_Connected]:
        """One transaction on the process's second connection (a sweeper pass, a migration)."""
        with self._tx_lock:
            conn = self._live_tx_connection()
            try:
                with conn.transaction():
                    yield _Connected(conn, sealer=self.sealer)
            except psycopg.OperationalError as error:
                translated = translate(error, self.url)
                if conn.broken or isinstance(translated, ServiceUnavailable):
                    self._tx_conn = None
                raise translated from error

    def _live_tx_connection(self) -> psycopg.Connection[Row]:
        """The transaction connection, replaced first if the server dropped it since its last
        use (the first statement of a pass would fail on it after a Postgres restart)."""
        for attempt in (1, 2):
            if self._tx_conn is None or self._tx_conn.closed:
                self._tx_conn = self._connect()
            try:
                _run(self._tx_conn, query("ping"), {})
                return self._tx_conn
            except psycopg.OperationalError as error:
                translated = translate(error, self.url)
                self._tx_conn = None
                if attempt == 2 or not isinstance(translated, ServiceUnavailable):
                    raise translated from error
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock, self._tx_lock:
            for conn in (self._conn, self._tx_conn):
                if conn is not None and not conn.closed:
                    conn.close()
            self._conn = self._tx_conn = None


def translate(error: psycopg.OperationalError, url: str) -> Exception:
    """ServiceUnavailable for 'cannot reach Postgres'; other errors are left as they are."""
    state = error.sqlstate or ""
    unreachable = (
        not state
        or state.startswith("08")  # connection exception
        or state.startswith("53")  # insufficient resources (too many connections, disk full)
        or state in ("57P01", "57P02", "57P03")  # admin/crash shutdown, cannot connect now
    )
    if not unreachable:
        return error
    return ServiceUnavailable(
        f"lost the connection to Postgres at {describe_url(url)}: {_first_line(error)}"
    )


def _first_line(error: BaseException | None) -> str:
    text = str(error or "").strip()
    return text.splitlines()[0] if text else type(error).__name__


_live: weakref.WeakSet[Database] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for db in list(_live):
        db._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
