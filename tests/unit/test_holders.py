"""Who holds a claim, and whether a holder on this machine has died."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from durable_agent.journal.holders import holder_is_dead, host_token, worker_identity

pytestmark = pytest.mark.skipif(host_token() is None, reason="needs /proc")


def owner_of(pid: int, token: str | None = None) -> str:
    return f"{socket.gethostname()}:{pid}:1#{token or host_token()}"


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_identity_names_host_process_thread_and_machine() -> None:
    host, pid, rest = worker_identity().split(":")
    thread, token = rest.split("#")
    assert (host, int(pid), int(thread)) == (
        socket.gethostname(),
        os.getpid(),
        threading.get_ident(),
    )
    assert token == host_token() and len(token) == 12


def test_a_reaped_process_is_dead() -> None:
    child = sleeper()
    child.kill()
    child.wait()
    assert holder_is_dead(owner_of(child.pid))


def test_a_killed_process_not_yet_reaped_is_dead() -> None:
    """A zombie runs nothing, even though its pid still exists."""
    child = sleeper()
    try:
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, still unreaped
        assert holder_is_dead(owner_of(child.pid))
    finally:
        child.wait()


def test_live_and_stopped_processes_are_not_dead() -> None:
    """A frozen (SIGSTOP) worker may wake up: only the lease may end its claim."""
    child = sleeper()
    try:
        assert not holder_is_dead(owner_of(child.pid))
        os.kill(child.pid, signal.SIGSTOP)
        assert not holder_is_dead(owner_of(child.pid))
    finally:
        child.kill()
        child.wait()


def test_holders_this_machine_cannot_judge_are_never_dead() -> None:
    child = sleeper()
    child.kill()
    child.wait()
    assert not holder_is_dead(owner_of(child.pid, token="0123456789ab"))  # another machine
    assert not holder_is_dead(f"{socket.gethostname()}:{child.pid}:1")  # no token
    assert not holder_is_dead(owner_of(os.getpid()))  # this process
    assert not holder_is_dead(None)
    assert not holder_is_dead(f"garbage#{host_token()}")
