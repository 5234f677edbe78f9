"""The project's own compose.yaml, brought up for real with three workers.

Runs with ``make test-compose`` (CI calls it after ``make test``): it needs a Docker engine
with Compose v2 and the images compose.yaml names (``postgres:15-bookworm``,
``redis:7-bookworm``, ``debian:bookworm-slim``), which ``../shared/containers/engine.sh up``
provides on these machines. The stack is torn down (``down -v``) even when a check fails.

What it shows: the demo profile runs a real turn with no API key; Flower refuses a request
without credentials and lists the three workers with them; a worker container SIGKILLed
while its turn waits for the model is not waited for beyond its lease: another worker
finishes the turn, and one email arrives. Each service connects under its own role, the
application's role cannot write the journal, and with a key in .env the tables hold no
message, reply or argument in clear.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("application", "worker", "operator")
KEY = base64.b64encode(secrets.token_bytes(32)).decode()
pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    project: str
    env_file: Path
    flower_port: int
    flower_auth: str
    console_port: int
    console_auth: str
    prometheus_port: int
    postgres_password: str
    role_passwords: dict[str, str]

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        command = [
            "docker",
            "compose",
            "--project-directory",
            str(ROOT),
            "-p",
            self.project,
            "--env-file",
            str(self.env_file),
            "--profile",
            "demo",
            "--profile",
            "metrics",
            *args,
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def sql(self, query: str, user: str = "durable_agent", check: bool = True) -> str:
        return self.compose(
            "exec", "-T", "db", "psql", "-U", user, "-d", "durable_agent", "-tAc", query,
            check=check,
        ).strip()  # fmt: skip

    def psql_error(self, query: str, user: str) -> str:
        """What psql says to ``query`` run as ``user`` (stderr; "" when it succeeded)."""
        result = subprocess.run(
            [
                "docker", "compose", "--project-directory", str(ROOT), "-p", self.project,
                "--env-file", str(self.env_file), "--profile", "demo",
                "exec", "-T", "db", "psql", "-U", user, "-d", "durable_agent", "-tAc", query,
            ],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return result.stderr if result.returncode else ""

    def port(self, service: str, port: int) -> int:
        return int(self.compose("port", service, str(port)).strip().rsplit(":", 1)[1])

    def http(self, method: str, url: str, auth: str | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            url, method=method, data=b"{}" if method == "POST" else None
        )
        if auth:
            import base64

            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None

    def page(self, url: str, auth: str | None = None) -> tuple[int, str]:
        """GET an HTML page: its status and text (the status alone when it fails)."""
        request = urllib.request.Request(url)
        if auth:
            import base64

            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, ""
        except (urllib.error.URLError, ConnectionError):
            return 0, ""

    def worker_containers(self) -> dict[str, str]:
        """Container hostname -> container id, for the worker service."""
        ids = self.compose("ps", "-q", "worker").split()
        found = {}
        for container in ids:
            hostname = subprocess.run(
                ["docker", "inspect", "-f", "{{.Config.Hostname}}", container],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            found[hostname] = container
        return found


def _wait(condition: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode
    ):
        pytest.fail("needs Docker with Compose v2: run ../shared/containers/engine.sh up first")
    folder = tmp_path_factory.mktemp("compose")
    stack = Stack(
        project=f"da-compose-{uuid.uuid4().hex[:8]}",
        env_file=folder / ".env",
        flower_port=_free_port(),
        flower_auth=f"admin:{secrets.token_urlsafe(12)}",
        console_port=_free_port(),
        console_auth=f"ops:{secrets.token_urlsafe(12)}",
        prometheus_port=_free_port(),
        postgres_password=secrets.token_urlsafe(16),
        role_passwords={kind: secrets.token_urlsafe(16) for kind in ROLES},
    )
    stack.env_file.write_text(
        "\n".join(
            [
                f"POSTGRES_PASSWORD={stack.postgres_password}",
                *(f"{kind.upper()}_DB_PASSWORD={p}" for kind, p in stack.role_passwords.items()),
                f"DURABLE_AGENT_KEYS=k1:{KEY}",
                f"FLOWER_BASIC_AUTH={stack.flower_auth}",
                f"FLOWER_PORT={stack.flower_port}",
                f"CONSOLE_AUTH={stack.console_auth}",
                f"CONSOLE_PORT={stack.console_port}",
                f"PROMETHEUS_PORT={stack.prometheus_port}",
                "WORKER_CONCURRENCY=2",
                "",
            ]
        )
    )
    try:
        stack.compose("up", "-d", "--build", "--scale", "worker=3", "--wait", timeout=900)
        yield stack
    finally:
        logs = stack.compose("logs", "--no-color", "--tail", "200", check=False)
        (folder / "compose.log").write_text(logs)
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def test_the_demo_profile_runs_a_turn_with_no_api_key(stack: Stack) -> None:
    def demo_exited() -> str:
        return stack.compose("ps", "-a", "--format", "{{.State}} {{.ExitCode}}", "demo").strip()

    _wait(lambda: demo_exited().startswith("exited"), 180, "the demo turn")
    assert demo_exited() == "exited 0"
    logs = stack.compose("logs", "--no-color", "demo")
    assert "Done: the note 'launch' was sent to ada@example.com." in logs, logs


def test_prometheus_scrapes_the_fleets_figures_and_every_worker(stack: Stack) -> None:
    """The metrics profile: Prometheus (Debian's package) scrapes `durable-agent metrics` and
    the three workers' own ports; a query through its HTTP API reads the demo's done turn."""
    base = f"http://127.0.0.1:{stack.prometheus_port}/api/v1/query?query="

    def query(promql: str) -> list[Any]:
        code, data = stack.http("GET", base + urllib.parse.quote(promql))
        return data["data"]["result"] if code == 200 and data else []

    def done_turns() -> float:
        found = query('sum(durable_agent_turns{status="done"})')
        return float(found[0]["value"][1]) if found else 0.0

    _wait(lambda: done_turns() >= 1, 120, "a done turn in Prometheus")
    tokens = query('sum(durable_agent_model_tokens_total{type="input"})')
    assert tokens and float(tokens[0]["value"][1]) > 0, tokens
    _wait(
        lambda: len(query('up{job="durable-agent-workers"} == 1')) == 3,
        90,
        "the three workers' metrics scraped",
    )


def test_flower_needs_credentials_and_lists_the_three_workers(stack: Stack) -> None:
    base = f"http://127.0.0.1:{stack.flower_port}"
    status, _ = _wait(lambda: stack.http("GET", base + "/"), 60, "Flower")
    assert status == 401

    def workers() -> list[str]:
        code, data = stack.http("GET", base + "/api/workers?refresh=1", stack.flower_auth)
        return sorted(data) if code == 200 and data else []

    names = _wait(lambda: len(workers()) == 3 and workers(), 90, "three workers in Flower")
    hosts = set(stack.worker_containers())
    assert {name.split("@", 1)[1] for name in names} == hosts, (names, hosts)
    assert len(set(names)) == 3


def test_the_console_needs_credentials_and_shows_the_turns(stack: Stack) -> None:
    base = f"http://127.0.0.1:{stack.console_port}"
    status = _wait(lambda: stack.page(base + "/")[0] or None, 60, "the console")
    assert status == 401
    user = stack.console_auth.split(":", 1)[0]
    code, text = stack.page(base + "/", stack.console_auth)
    assert code == 200 and f'<span class="user">{user}</span>' in text
    assert stack.postgres_password not in text and "db:5432/durable_agent" in text
    code, _ = stack.page(base + "/workers", stack.console_auth)
    assert code == 200


def test_a_killed_worker_container_does_not_stop_its_turn(stack: Stack) -> None:
    model = f"http://127.0.0.1:{stack.port('model', 8000)}"
    inbox = f"http://127.0.0.1:{stack.port('inbox', 8025)}"
    address = f"kill-{uuid.uuid4().hex[:6]}@example.com"
    stack.http("POST", model + "/_hold")
    try:
        turn_id = stack.compose(
            "exec", "-T", "--index", "1", "worker",
            "durable-agent", "submit", "--session", f"kill-{address}",
            f"Email the note 'launch' to {address}",
        ).strip()  # fmt: skip
        _wait(lambda: stack.http("GET", model + "/_stats")[1]["waiting"] >= 1, 60, "the model call")
        owner = stack.sql(f"SELECT lease_owner FROM turns WHERE turn_id = '{turn_id}'")
        host = owner.split(":", 1)[0]
        victim = stack.worker_containers()[host]
        subprocess.run(
            ["docker", "kill", "--signal", "KILL", victim], check=True, capture_output=True
        )
    finally:
        stack.http("POST", model + "/_release")

    status = _wait(
        lambda: stack.sql(f"SELECT status FROM turns WHERE turn_id = '{turn_id}'") == "done",
        90,
        "the turn to finish on another worker",
    )
    assert status
    survivor = next(c for c in stack.worker_containers().values() if c != victim)
    reply = subprocess.run(  # read through a worker container: the reply is sealed in the table
        ["docker", "exec", survivor, "durable-agent", "wait", turn_id, "--timeout", "5"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # another owner took the claim over after the lease: one crash, two attempts
    claims = stack.sql(f"SELECT crashes || '/' || attempts FROM turns WHERE turn_id = '{turn_id}'")
    _, emails = stack.http("GET", f"{inbox}/messages?to={address}")
    assert reply == f"Done: the note 'launch' was sent to {address}.", reply
    assert claims == "1/2", claims
    assert len(emails) == 1, emails


def test_each_service_connects_under_its_own_role(stack: Stack) -> None:
    _wait(lambda: stack.page(f"http://127.0.0.1:{stack.console_port}/")[0], 60, "the console")
    stack.page(f"http://127.0.0.1:{stack.console_port}/", stack.console_auth)
    users = set(
        stack.sql(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'durable_agent'"
        ).split()
    )
    assert {"durable_agent_worker", "durable_agent_operator"} <= users, users
    app = "durable_agent_application"
    for query in (
        "INSERT INTO journal (turn_id, step, kind, name, input, status, epoch) "
        "SELECT turn_id, 99, 'tool', 'x', '{}', 'done', 1 FROM turns LIMIT 1",
        "UPDATE turns SET status = 'running', lease_epoch = lease_epoch + 1",
        "UPDATE approvals SET decision = 'approved'",
        "DELETE FROM audit_log",
    ):
        assert "permission denied" in stack.psql_error(query, app), query
    assert stack.psql_error("DELETE FROM audit_log", "durable_agent_worker")


def test_the_tables_hold_no_payload_in_clear(stack: Stack) -> None:
    _wait(
        lambda: stack.sql("SELECT count(*) FROM turns WHERE status = 'done'") != "0", 180, "a turn"
    )
    dump = stack.sql(
        "SELECT string_agg(t::text, ' ') FROM turns AS t UNION ALL "
        "SELECT string_agg(j::text, ' ') FROM journal AS j"
    )
    assert "ada@example.com" not in dump and "launch" not in dump
    assert "send_email" in dump and "k1:" in dump
