"""Real worker processes for tests, evals and the demo: start, wait until ready, kill.

Every process is started in its own session (process group), so killing it by PID also
kills a prefork pool's children; ``stop()`` is idempotent and always leaves no process.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import redis

from ..settings import Settings

_ALIASES = {"openai_base_url": "OPENAI_BASE_URL", "openai_api_key": "OPENAI_API_KEY"}


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce these settings in another process."""
    env = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        key = _ALIASES.get(name, "DURABLE_AGENT_" + name.upper())
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def forget_queue(client: redis.Redis, queue: str) -> None:
    """Remove a queue's messages from Redis: the queue and kombu's unacked copies.

    A worker killed with a message in hand leaves it in kombu's global ``unacked`` hash;
    left there, it would be restored to a queue nobody reads an hour later.
    """
    client.delete(queue, *(f"{queue}\x06\x16{priority}" for priority in range(10)))
    # kombu's bindings of the queue's exchange: _kombu.binding.<queue> and, for the
    # exchanges a worker declared, _kombu.binding_permanent.<queue>
    bindings = list(client.scan_iter(match=f"_kombu.binding*.*{queue}*"))
    if bindings:
        client.delete(*bindings)
    stale = [
        tag
        for tag, payload in client.hscan_iter("unacked")
        if queue.encode() in payload  # the payload ends with [exchange, routing_key]
    ]
    if stale:
        client.hdel("unacked", *stale)
        client.zrem("unacked_index", *stale)


def queued_turns(client: redis.Redis, queue: str) -> list[tuple[str, str]]:
    """(session_id, turn_id) of every ``run_turn`` message waiting in a queue's Redis list."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        found.append((args[0], args[1]))
    return found


def _exit_with_parent() -> None:
    """In the child before exec: get SIGKILL when the process that started it dies, so a
    killed eval or demo leaves no worker behind (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


class WorkerProcess:
    """One ``durable-agent worker`` process (solo pool by default: one turn at a time)."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        name: str = "worker",
        die_with_parent: bool = False,
    ) -> None:
        inherited = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}  # armed only if asked
        self.env = {**inherited, **env, "PYTHONUNBUFFERED": "1"}
        self.log_path = log_path
        self.pool = pool
        self.concurrency = concurrency
        self.name = name
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "worker not started"
        return self.process.pid

    def command(self) -> list[str]:
        """The worker's command line."""
        return [
            sys.executable,
            "-m",
            "durable_agent",
            "worker",
            "--pool",
            self.pool,
            "--concurrency",
            str(self.concurrency),
            "--without-mingle",
            "--without-gossip",
            "--hostname",
            f"{self.name}-{os.getpid()}-{time.monotonic_ns()}@%h",
        ]

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_exit_with_parent if self.die_with_parent else None,
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        """The pids of the worker's live pool children (prefork), from /proc."""
        if not self.alive():
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.pid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
        return sorted(found)

    def wait_ready(self, timeout: float = 30.0) -> Self:
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited during start:\n{self.log_tail()}")
            return " ready." in self.log_text()

        wait_until(ready, timeout, f"{self.name} to be ready")
        return self

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as error:
            raise TimeoutError(f"{self.name} still running after {timeout:g}s") from error

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send a signal to the worker's whole process group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Warm shutdown, then SIGKILL if it takes too long; no process is left behind."""
        if self.process is None:
            return
        if self.alive():
            self.kill(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.process.wait(timeout)
        # children of a prefork pool that outlived their parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
