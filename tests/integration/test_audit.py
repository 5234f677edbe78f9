"""The audit trail on a real Postgres: every operator action is appended with who, when,
what, the interface it came through (Python, the command line, the console) and the state
before and after; a refused action adds nothing; a worker resuming a turn under a changed
agent is recorded; `durable-agent audit` lists it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from durable_agent.app import operator as ops
from durable_agent.cli import main
from durable_agent.journal import Claim, set_interface
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.agents import Agent
from durable_agent.testing import ScriptedModelServer
from durable_agent.web.app import create_app
from durable_agent.web.auth import Authenticator

TOKEN = "tok-0123456789abcdef"
BASE = "http://console.test"


@pytest.fixture(autouse=True)
def python_interface() -> Iterator[None]:
    set_interface("python")  # main() of an earlier test in this process set "cli"
    yield
    set_interface("python")


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DURABLE_AGENT_BROKER_URL", settings.broker_url)
    monkeypatch.setenv("DURABLE_AGENT_QUEUE", settings.queue)


def _claimed(runtime: Runtime, session: str) -> str:
    turn = runtime.journal.create_turn(session, "hello")
    assert isinstance(runtime.leases.claim(turn.turn_id, "host:1:2#tok", 30.0), Claim)
    return turn.turn_id


def test_actions_from_python_the_cli_and_the_console_are_appended(
    runtime: Runtime,
    settings: Settings,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    by_python = _claimed(runtime, "a")
    by_cli = _claimed(runtime, "b")
    by_console = _claimed(runtime, "c")

    ops.cancel_turn(by_python, "wrong order", by="ada", settings=settings)
    assert not ops.cancel_turn(by_python, "again", by="ada", settings=settings).requested
    assert main(["cancel", by_cli, "--reason", "duplicate", "--by", "bob"]) == 0
    client = TestClient(
        create_app(runtime, Authenticator({}, TOKEN)), base_url=BASE, follow_redirects=False
    )
    response = client.post(
        f"/turns/{by_console}/cancel",
        data={"reason": "test"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 303
    capsys.readouterr()

    entries = ops.audit_trail(settings=settings)
    assert [(e.turn_id, e.actor, e.interface, e.action) for e in entries] == [
        (by_console, "token", "console", "cancel"),
        (by_cli, "bob", "cli", "cancel"),
        (by_python, "ada", "python", "cancel"),  # the second request changed nothing
    ]
    assert entries[-1].before == {"cancel_requested": False}
    assert entries[-1].after == {"cancel_requested": True, "reason": "wrong order"}

    assert main(["audit", "--json", "--turn", by_cli]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["actor"], e["interface"], e["after"]["reason"]) for e in listed] == [
        ("bob", "cli", "duplicate")
    ]
    assert main(["audit"]) == 0
    assert "bob" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        main(["audit", "--action", "launch"])
    assert usage.value.code == 2


def test_a_resume_under_a_changed_agent_is_recorded(
    settings: Settings, runtime: Runtime, clock: object
) -> None:
    with ScriptedModelServer(lambda body: {"role": "assistant", "content": "ok"}) as model:
        first = Agent(name="default", instructions="Be brief.")
        turn = runtime.journal.create_turn("s", "hello")
        changed = settings.model_copy(
            update={"openai_base_url": model.base_url, "system_prompt": "Be verbose."}
        )
        # the turn's first claim recorded another agent's digest: its resume is a change
        claim = runtime.leases.claim(turn.turn_id, "host:9:9#old", 0.1)
        assert isinstance(claim, Claim)
        runtime.journal.record_turn_agent(
            turn.turn_id, claim.epoch, "0" * 64, {"instructions": first.instructions}, None
        )
        clock.advance(5.0)  # type: ignore[attr-defined]
        resumed = Runtime(changed)
        try:
            resumed.build_turn_worker().handle(turn.turn_id)
        finally:
            resumed.close()
    [entry] = ops.audit_trail(action="agent_changed", settings=settings)
    assert entry.interface == "worker" and entry.turn_id == turn.turn_id
    assert entry.before["digest"] == "0" * 64 and entry.after["digest"] != "0" * 64
