"""Process, port and log helpers shared by the embedded Postgres and Redis servers.

Also home of `EmbeddedServiceError`, the one error every part of the package raises
(re-exported by `durable_agent.embedded`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = [
    "PORT_ATTEMPTS",
    "EmbeddedServiceError",
    "free_port",
    "kill_group",
    "package_dir",
    "pid_alive",
    "proc_cmdline",
    "proc_cwd",
    "proc_exe_name",
    "server_env",
    "spawn",
    "tail",
    "terminate",
]

PORT_ATTEMPTS = 3
"""How many free ports a server start tries before giving up."""

_LOG_TAIL_LINES = 20


class EmbeddedServiceError(RuntimeError):
    """An embedded server is missing, cannot be started, or is not running."""


def package_dir(name: str) -> Path | None:
    """Where the installed package ``name`` lives, without importing it; None if absent."""
    # find_spec on a top-level name locates the package without importing it.
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else "(log is empty)"


def pid_alive(pid: int) -> bool:
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


def proc_exe_name(pid: int) -> str | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return None


def proc_cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def proc_cmdline(pid: int) -> list[str]:
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
        elif not pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def terminate(
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


def kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGKILL proc's whole process group (it leads one) and wait until every member is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    deadline = time.monotonic() + timeout
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    return env


def spawn(argv: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start argv in its own session, output appended to ``log``."""
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=server_env(),
                **kwargs,
            )
        except OSError as exc:
            raise EmbeddedServiceError(f"could not run {argv[0]}: {exc}") from exc
