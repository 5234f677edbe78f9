"""The web console with 100,000 turns: how long each page takes to answer.

A scratch database is filled by COPY with 100,000 turns of four agents over 60 days (three
journal rows each, two of them model calls with their usage), a few open ones (waiting for
an approval, running under five workers' claims, queued) and a few uncertain sends; then
ANALYZE, as autovacuum would. ``durable-agent console`` runs in a process of its own and
each page is asked for over one keep-alive HTTP connection with basic auth: the time is the
whole answer (query, rendering, HTTP), median and 95th percentile of :data:`SAMPLES`. The
goal: every page under 200 ms.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out

from . import scratch_database

TURNS = 100_000
DAYS = 60
AGENTS = ("default", "billing", "support", "triage")
SAMPLES = 20
WARMUP = 3
GOAL_MS = 200.0
LOGIN = ("bench", "bench-password")


def _fill(conn: psycopg.Connection[Any], turns: int) -> dict[str, str]:
    """The turns and their journals; returns ids the pages are asked about."""
    now = datetime.now(UTC)
    step = timedelta(days=DAYS) / turns
    picks: dict[str, str] = {}
    usage = (
        '{"message": {"content": "ok"}, "usage": {"prompt_tokens": %d, "completion_tokens": %d}}'
    )
    with conn.cursor() as cursor:
        with cursor.copy(
            "COPY turns (turn_id, session_id, seq, status, message, reply, error, attempts, "
            "crashes, lease_owner, lease_epoch, lease_expires_at, queue, agent, agent_digest, "
            "created_at, updated_at, finished_at, received_by, received_at) FROM STDIN"
        ) as copy:
            for i in range(turns):
                created = now - timedelta(days=DAYS) + step * i
                turn_id = f"turn_{uuid.uuid4().hex}"
                agent = AGENTS[i % len(AGENTS)]
                status, owner, expires, finished = "done", None, None, created
                if turns - i <= 20:
                    status, finished = "waiting", None
                elif turns - i <= 70:
                    status, finished = "running", None
                    owner = f"worker{i % 5}:{1000 + i % 5}:{i}#bench"
                    expires = now + timedelta(seconds=6)
                elif turns - i <= 100:
                    status, finished = "queued", None
                elif i % 97 == 0:
                    status = "failed"
                elif i % 89 == 0:
                    status = "cancelled"
                copy.write_row(
                    (
                        turn_id,
                        f"session-{i % 20_000}",
                        i // 20_000,
                        status,
                        "Refund order A-1001 in full.",
                        "Done." if status == "done" else None,
                        "gave up" if status == "failed" else None,
                        1,
                        0,
                        owner,
                        1,
                        expires,
                        f"q{i % len(AGENTS)}",
                        agent,
                        "d" * 64,
                        created,
                        created,
                        finished,
                        f"worker{i % 5}:{1000 + i % 5}:1#bench",
                        created,
                    )
                )
                if i == turns // 2:
                    picks["middle"] = f"{created.isoformat()}|{turn_id}"
                    picks["turn"] = turn_id
                    picks["session"] = f"session-{i % 20_000}"
                    picks["day"] = created.strftime("%Y-%m-%dT00:00")
                    picks["next_day"] = (created + timedelta(days=1)).strftime("%Y-%m-%dT00:00")
        cursor.execute("SELECT turn_id, created_at, status FROM turns")
        rows = cursor.fetchall()
        with cursor.copy(
            "COPY journal (turn_id, step, kind, name, input, replay, status, output, epoch, "
            "first_epoch, created_at, finished_at) FROM STDIN"
        ) as copy:
            for n, (turn_id, created, status) in enumerate(rows):
                later = created + timedelta(milliseconds=400)
                prompt, completion = 300 + n % 200, 20 + n % 50
                uncertain = status == "waiting" and n % 4 == 0
                copy.write_row(
                    (
                        turn_id,
                        0,
                        "model",
                        "llm",
                        '{"model": "gpt-4o-mini"}',
                        "safe",
                        "done",
                        usage % (prompt, completion),
                        1,
                        1,
                        created,
                        later,
                    )
                )
                copy.write_row(
                    (
                        turn_id,
                        1,
                        "tool",
                        "refund_order",
                        '{"order_id": "A-1001"}',
                        "never",
                        "done",
                        '{"uncertain": true, "content": "may or may not"}'
                        if uncertain
                        else '{"content": "refunded"}',
                        1,
                        1,
                        later,
                        later,
                    )
                )
                copy.write_row(
                    (
                        turn_id,
                        2,
                        "model",
                        "llm",
                        '{"model": "gpt-4o-mini"}',
                        "safe",
                        "done",
                        usage % (prompt + 80, completion),
                        1,
                        1,
                        later,
                        later,
                    )
                )
        cursor.execute(
            "INSERT INTO approvals (turn_id, step, tool, arguments) "
            "SELECT turn_id, 3, 'refund_order', '{\"order_id\": \"A-1001\"}' FROM turns "
            "WHERE status = 'waiting'"
        )
    conn.execute("ANALYZE")
    return picks


def _pages(picks: dict[str, str]) -> list[tuple[str, str]]:
    return [
        ("turns, newest", "/"),
        ("turns, page 1,000 (keyset)", f"/?before={_quote(picks['middle'])}"),
        ("turns, status waiting", "/?status=waiting"),
        ("turns, failed of one agent", "/?status=failed&agent=billing"),
        ("turns, one session", f"/?session={picks['session']}"),
        ("turns, one queue", "/?queue=q2"),
        ("turns, one day", f"/?since={picks['day']}&until={picks['next_day']}"),
        ("a turn", f"/turns/{picks['turn']}"),
        ("approvals", "/approvals"),
        ("uncertain effects", "/uncertain"),
        ("spend, 14 days (figures kept)", "/spend"),
        ("spend, 60 days (figures kept)", "/spend?days=60"),
        ("agents", "/agents"),
        ("workers", "/workers"),
    ]


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _time_page(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {body[:300]!r}")
    return elapsed


def _summary(path: str, times: list[float]) -> dict[str, Any]:
    return {
        "path": path,
        "median": statistics.median(times),
        "p95": times[min(len(times) - 1, round(0.95 * (len(times) - 1)))],
        "samples": times,
    }


def run(turns: int = TURNS, samples: int = SAMPLES) -> dict[str, Any]:
    out.print(f"[bold]console[/bold]: pages with {turns:,} turns (goal: under {GOAL_MS:.0f} ms)")
    with scratch_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.monotonic()
            picks = _fill(conn, turns)
            out.print(f"  filled in {time.monotonic() - started:.0f} s")
        port = _free_port()
        env = {
            **os.environ,
            "DURABLE_AGENT_DATABASE_URL": url,
            "DURABLE_AGENT_CONSOLE_AUTH": ":".join(LOGIN),
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", "console", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            results = _measure(port, _pages(picks), samples)
        finally:
            server.terminate()
            server.wait(10)
    table = Table(title=f"console pages, {turns:,} turns (ms, {samples} samples each)")
    for column in ("page", "median", "p95", "under 200 ms"):
        table.add_column(column, justify="left" if column == "page" else "right")
    for name, figures in results["pages"].items():
        ok = "yes" if figures["p95"] < GOAL_MS else "NO"
        table.add_row(name, f"{figures['median']:.1f}", f"{figures['p95']:.1f}", ok)
    out.print(table)
    return results


def _measure(port: int, pages: list[tuple[str, str]], samples: int) -> dict[str, Any]:
    auth = base64.b64encode(":".join(LOGIN).encode()).decode()
    headers = {"Authorization": f"Basic {auth}", "Connection": "keep-alive"}
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            _time_page(conn, "/workers", headers)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    figures: dict[str, Any] = {}
    # the spend page's first visit of a window reads the ledger (then keeps it a minute):
    # each sample is a window not read before, 7 to 7 + samples days
    cold = sorted(_time_page(conn, f"/spend?days={7 + n}", headers) for n in range(samples))
    figures["spend, first read of a window"] = _summary("/spend?days=7..", cold)
    for name, path in pages:
        for _ in range(WARMUP):
            _time_page(conn, path, headers)
        times = sorted(_time_page(conn, path, headers) for _ in range(samples))
        figures[name] = _summary(path, times)
    conn.close()
    return {"turns": TURNS, "pages": figures, "goal_ms": GOAL_MS}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2, default=str))
