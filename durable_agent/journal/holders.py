"""Who holds a claim, and whether a holder on this machine has died.

A claim's ``lease_owner`` names the worker: ``host:pid:thread#token``. The token is a hash of
the kernel's boot id and this process's pid namespace, so two owners with the same token see
the same process table: for them, "process ``pid`` no longer exists" is a fact, not a guess.
A worker that finds a claim held by a dead process of its own machine may end that claim at
once instead of waiting for the lease to run out. Owners from other machines, containers with
their own pid namespace, or systems without ``/proc`` never match, and wait for the lease.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import threading
from pathlib import Path


@functools.cache
def host_token() -> str | None:
    """Same value for every process that shares this kernel boot and pid namespace."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pid_namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return hashlib.sha256(f"{boot_id}:{pid_namespace}".encode()).hexdigest()[:12]


def worker_identity() -> str:
    """The owner of a claim taken by this thread: ``host:pid:thread#token``."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    token = host_token()
    return f"{owner}#{token}" if token else owner


def holder_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` is a process of this machine that no longer runs."""
    token = host_token()
    if not owner or token is None or not owner.endswith(f"#{token}"):
        return False
    try:
        pid = int(owner.rsplit("#", 1)[0].split(":")[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False  # a thread of this very process: it is not dead
    return not _running(pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:  # a killed process its parent has not reaped yet is a zombie: it runs nothing
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
