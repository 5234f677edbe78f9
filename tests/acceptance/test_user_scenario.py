"""The crash matrix on a user's own tools and a user's own loop, as users run it: the
scenario of tests/user_app/giftshop (tools the library does not ship) through the command
line and through the pytest plugin, and the plan-then-act example loop through the plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env

VOUCHER_POINTS = [(3, "before_run"), (3, "after_run")]


@pytest.mark.long
@pytest.mark.timeout(240)
def test_user_scenario_through_the_cli(settings: Settings, user_app: Path, tmp_path: Path) -> None:
    """`durable-agent eval crash-matrix --scenario giftshop.scenarios:vouchers`, from the
    user's project folder: one voucher at both crash points of issue_voucher (never)."""
    report_path = tmp_path / "matrix.json"
    env = {**os.environ, **settings_env(settings)}
    env.pop("CRASH_AT", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "eval",
            "crash-matrix",
            "--scenario",
            "giftshop.scenarios:vouchers",
            "--point",
            "issue_voucher:before_run",
            "--point",
            "issue_voucher:after_run",
            "--json",
            str(report_path),
        ],
        cwd=user_app,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["agent"] == "vouchers" and report["passed"] is True
    assert report["clean_steps"] == [
        "model llm",
        "tool voucher_balance (safe)",
        "model llm",
        "tool issue_voucher (never)",
        "model llm",
    ]
    assert [(p["step"], p["point"]) for p in report["points"]] == VOUCHER_POINTS
    for point in report["points"]:
        assert point["effects"] == {"issue_voucher": 1}, point
        assert point["repeated_finished"] == 0 and point["same_reply"], point
    assert "crash matrix: vouchers (agent vouchers)" in result.stdout


@pytest.mark.timeout(240)
def test_user_scenario_through_the_pytest_plugin(
    crash_matrix: Callable[..., Any], user_app: Path
) -> None:
    """The plugin's crash_matrix fixture runs the same scenario and returns the report."""
    report = crash_matrix("giftshop.scenarios:vouchers", only=[("issue_voucher", "after_run")])
    assert report.passed and report.agent == "vouchers"
    assert [(p.step, p.point, p.effects) for p in report.points] == [
        (3, "after_run", {"issue_voucher": 1})
    ]


@pytest.mark.timeout(240)
def test_plugin_fails_the_test_with_the_table(
    crash_matrix: Callable[..., Any], user_app: Path
) -> None:
    """issue_voucher wrongly labelled safe: the second voucher fails the test, with the table."""
    with pytest.raises(pytest.fail.Exception) as failed:
        crash_matrix(
            "giftshop.scenarios:vouchers",
            only=[("issue_voucher", "after_run")],
            relabel={"issue_voucher": "safe"},
        )
    text = str(failed.value)
    assert "issue_voucher took effect 2 times (expected 1)" in text
    assert "crash matrix: vouchers" in text and "FAIL" in text


@pytest.mark.long
@pytest.mark.timeout(240)
def test_plan_then_act_loop_passes_the_crash_matrix(
    crash_matrix: Callable[..., Any], durable_agent_settings: Settings
) -> None:
    """A loop that is not ours in shape (plan as JSON, act, re-plan, report), written on the
    public API: the never tool's two points, a plan and a re-plan interrupted after the model
    answered. (`durable-agent eval crash-matrix --scenario
    durable_agent_examples.plan_act_scenario:scenario` runs all ten points.)"""
    report = crash_matrix(
        "durable_agent_examples.plan_act_scenario:scenario",
        only=[(0, "after_run"), ("send_email", "before_run"), ("send_email", "after_run")],
    )
    assert report.agent == "planner"
    assert report.clean_steps == [
        "model llm",
        "tool lookup_note (safe)",
        "tool send_email (never)",
        "model llm",
        "model llm",
    ]
    assert [(p.step, p.point) for p in report.points] == [
        (0, "after_run"),
        (2, "before_run"),
        (2, "after_run"),
    ]
    assert all(p.effects == {"send_email": 1} and p.same_reply for p in report.points)
    assert report.points[0].repeated_interrupted == 1  # the plan in flight ran once more

    # a turn of the loop replays from its journal alone, with the model switched off
    from durable_agent.operate.replay import replay_turn
    from durable_agent.runtime import Runtime

    runtime = Runtime(
        durable_agent_settings.model_copy(
            update={"tools": "durable_agent_examples.email_tools,durable_agent_examples.plan_act"}
        )
    )
    try:
        replayed = replay_turn(
            runtime.journal,
            runtime.agents,
            report.points[2].turn_id,
            max_steps=runtime.settings.max_steps,
        )
    finally:
        runtime.close()
    assert replayed.ok and replayed.model_calls == 0, replayed.describe()


def test_plugin_fixtures_run_a_turn_of_the_users_agent(
    scripted_model: Callable[..., Any],
    smtp_inbox: Any,
    durable_workers: Callable[..., Any],
    durable_agent_settings: Settings,
    user_app: Path,
    tmp_path: Path,
) -> None:
    """scripted_model, smtp_inbox and durable_workers: a user's own end-to-end test."""
    from giftshop.policies import by_model

    from durable_agent import start_turn, wait_for_turn

    model = scripted_model(by_model)
    settings = durable_agent_settings.model_copy(
        update={
            "openai_base_url": model.base_url,
            "tools": "giftshop.tools",
            "agents": "giftshop.agents",
        }
    )
    ledger = tmp_path / "ledger.txt"
    durable_workers(settings=settings, GIFTSHOP_LEDGER=str(ledger), SMTP_URL=smtp_inbox.smtp_url)

    voucher = start_turn(
        "c-9", "Give customer c-9 a voucher of 100 cents.", agent="vouchers", settings=settings
    )
    note = start_turn(
        "n-1", "Email the note 'offsite' to eve@example.com", agent="support", settings=settings
    )

    assert wait_for_turn(voucher, 60, settings=settings).reply == (
        "Issued a voucher of 100 cents to c-9."
    )
    assert wait_for_turn(note, 60, settings=settings).status == "done"
    assert ledger.read_text().split()[:2] == ["c-9", "100"]
    assert [m.subject for m in smtp_inbox.messages] == ["Note: offsite"]


@pytest.mark.timeout(240)
def test_scenario_against_a_real_endpoint(
    crash_matrix: Callable[..., Any],
    scripted_model: Callable[..., Any],
    durable_agent_settings: Settings,
    user_app: Path,
) -> None:
    """policy=None runs the scenario against the configured endpoint (here a server the
    matrix does not control): effects and outcomes count, repeats are not claimed."""
    from dataclasses import replace

    from giftshop.policies import vouchers

    from durable_agent.testing import load_scenario

    endpoint = scripted_model(vouchers)
    settings = durable_agent_settings.model_copy(update={"openai_base_url": endpoint.base_url})
    scenario = replace(load_scenario("giftshop.scenarios:vouchers"), policy=None)

    report = crash_matrix(scenario, settings=settings, only=[("issue_voucher", "after_run")])

    assert not report.scripted and report.clean_model_requests is None
    assert [(p.step, p.effects, p.model_requests) for p in report.points] == [
        (3, {"issue_voucher": 1}, None)
    ]
    assert endpoint.request_count > 0
