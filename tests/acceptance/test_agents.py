"""Two agents side by side on one database and queue set: each with its own model, tools and
queue, each served by its own real worker, each turn run with its own agent's tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import start_turn, wait_for_turn
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox
from durable_agent.testing.harness import WorkerProcess, settings_env

VOUCHER_TOOLS = {"voucher_balance", "issue_voucher"}
SUPPORT_TOOLS = {"lookup_note", "send_email", "list_sent_emails"}


class SupportWorker(WorkerProcess):
    """A worker started with ``durable-agent worker --agent support``."""

    def command(self) -> list[str]:
        return [*super().command(), "--agent", "support"]


@pytest.fixture
def shop(
    settings: Settings, user_app: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """The giftshop's two agents on their own queues, one scripted model for both."""
    from giftshop.policies import by_model

    queues = {
        "GIFTSHOP_VOUCHER_QUEUE": f"vouchers-{uuid.uuid4().hex[:8]}",
        "GIFTSHOP_SUPPORT_QUEUE": f"support-{uuid.uuid4().hex[:8]}",
    }
    for name, value in queues.items():
        monkeypatch.setenv(name, value)
    with ScriptedModelServer(by_model) as model, SmtpInbox() as inbox:
        shop_settings = settings.model_copy(
            update={
                "openai_base_url": model.base_url,
                "tools": "giftshop.tools",
                "agents": "giftshop.agents",
            }
        )
        env = {
            **settings_env(shop_settings),
            **queues,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(user_app), os.environ.get("PYTHONPATH")])
            ),
            "GIFTSHOP_LEDGER": str(tmp_path / "ledger.txt"),
            "SMTP_URL": inbox.smtp_url,
            "INBOX_URL": inbox.api_url,
        }
        workers = [
            WorkerProcess(
                {**env, "DURABLE_AGENT_SERVE_AGENTS": "vouchers"}, tmp_path / "v.log", name="v"
            ),
            SupportWorker(env, tmp_path / "s.log", name="s"),
        ]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_ready(timeout=60)
            yield {
                "settings": shop_settings,
                "model": model,
                "inbox": inbox,
                "workers": workers,
                "env": env,
                "ledger": tmp_path / "ledger.txt",
            }
        finally:
            for worker in workers:
                worker.stop(timeout=5)
            Runtime(shop_settings).close()


@pytest.mark.timeout(120)
def test_two_agents_run_side_by_side_each_with_its_own_tools(shop: dict[str, Any]) -> None:
    settings: Settings = shop["settings"]
    vouchers_worker, support_worker = shop["workers"]
    turns = {
        start_turn(
            "c-1", "Give customer c-1 a voucher of 500 cents.", agent="vouchers", settings=settings
        ): "vouchers",
        start_turn(
            "c-2", "Give customer c-2 a voucher of 700 cents.", agent="vouchers", settings=settings
        ): "vouchers",
        start_turn(
            "t-1", "Email the note 'launch' to ada@example.com", agent="support", settings=settings
        ): "support",
    }
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "submit",
            "--session",
            "t-2",
            "--agent",
            "support",
            "Email the note 'standup' to bob@example.com",
        ],
        env={**os.environ, **shop["env"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    turns[submitted.stdout.strip()] = "support"

    runtime = Runtime(settings)
    for turn_id, agent in turns.items():
        turn = wait_for_turn(turn_id, 60, settings=settings)
        assert turn.status == "done", turn.error
        assert turn.agent == agent and turn.agent_digest == runtime.agents[agent].digest
        assert turn.agent_changes is None
        steps = runtime.journal.load_journal(turn_id)
        used = {s.name for s in steps if s.kind == "tool"}
        assert used == (VOUCHER_TOOLS if agent == "vouchers" else {"lookup_note", "send_email"})
        # received (and run) by the worker that serves its agent
        expected = vouchers_worker if agent == "vouchers" else support_worker
        assert turn.received_by and f":{expected.pid}:" in turn.received_by, turn.received_by

    # each request carried its agent's model, tools and parameters
    by_model: dict[str, set[frozenset[str]]] = {}
    for request in shop["model"].requests:
        names = frozenset(t["function"]["name"] for t in request.get("tools") or [])
        by_model.setdefault(request["model"], set()).add(names)
        if request["model"] == "voucher-model":
            assert request["temperature"] == 0
            assert request["messages"][0]["content"].startswith("You issue gift vouchers.")
    assert by_model == {
        "voucher-model": {frozenset(VOUCHER_TOOLS)},
        "support-model": {frozenset(SUPPORT_TOOLS)},
    }
    assert sorted(line.split()[0] for line in shop["ledger"].read_text().splitlines()) == [
        "c-1",
        "c-2",
    ]
    assert sorted(m.subject for m in shop["inbox"].messages) == ["Note: launch", "Note: standup"]

    listed = subprocess.run(
        [sys.executable, "-m", "durable_agent", "turns", "--json"],
        env={**os.environ, **shop["env"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert {t["turn_id"]: t["agent"] for t in json.loads(listed.stdout)} == turns
    runtime.close()
