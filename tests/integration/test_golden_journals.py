"""Turns recorded by an earlier version replay identically: what guards upgrades.

``tests/golden/*.json`` are real turns written by durable-agent (``tests/golden/record.py``):
their settings, their session's turns and journals. Each is loaded into a fresh database
and every done turn is replayed with the model switched off and every write refused. A
change to how the conversation is built, how steps are numbered, what a tool result or an
uncertain call says, or how payloads are encoded makes the replay diverge here, before it
makes a turn in flight diverge in production.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from durable_agent.operate.replay import replay_turn
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings

GOLDEN = sorted((Path(__file__).parents[1] / "golden").glob("*.json"))


def _load(pg: psycopg.Connection, recording: dict[str, Any]) -> None:
    for turn in recording["turns"]:
        pg.execute(
            "INSERT INTO turns (turn_id, session_id, seq, status, message, reply, lease_epoch) "
            "VALUES (%s, 'golden', %s, %s, %s, %s, %s)",
            (
                turn["turn_id"],
                turn["seq"],
                turn["status"],
                turn["message"],
                turn["reply"],
                turn["lease_epoch"],
            ),
        )
        for step in recording["journal"][turn["turn_id"]]:
            pg.execute(
                "INSERT INTO journal (turn_id, step, kind, name, input, replay, status, output, "
                "epoch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    turn["turn_id"],
                    step["step"],
                    step["kind"],
                    step["name"],
                    Jsonb(step["input"]),
                    step["replay"],
                    step["status"],
                    Jsonb(step["output"]),
                    step["epoch"],
                ),
            )


def test_there_are_golden_journals() -> None:
    assert len(GOLDEN) >= 4, GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_a_recorded_turn_replays_identically(
    path: Path, settings: Settings, pg: psycopg.Connection
) -> None:
    recording = json.loads(path.read_text())
    _load(pg, recording)
    runtime = Runtime(settings.model_copy(update=recording["settings"]))
    try:
        for turn in recording["turns"]:
            report = replay_turn(runtime, turn["turn_id"])
            assert report.ok, f"{path.name}: {report.describe()}"
            assert report.model_calls == 0
            assert report.replayed_reply == turn["reply"]
            assert report.steps_replayed == len(recording["journal"][turn["turn_id"]])
    finally:
        runtime.close()


def test_a_changed_system_prompt_diverges_at_the_first_model_step(
    settings: Settings, pg: psycopg.Connection
) -> None:
    """The guard itself works: the same recording under another prompt does not replay."""
    recording = json.loads(GOLDEN[0].read_text())
    _load(pg, recording)
    changed = {**recording["settings"], "system_prompt": "You are somebody else."}
    runtime = Runtime(settings.model_copy(update=changed))
    try:
        report = replay_turn(runtime, recording["turns"][0]["turn_id"])
    finally:
        runtime.close()
    assert not report.ok
    assert report.diverged_at == 0


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_a_recorded_turn_resumes_under_the_same_agent(path: Path, settings: Settings) -> None:
    """The agent a turn recorded when it first ran (its digest: model, instructions, loop,
    tools) is the agent this code builds from the same settings, so a turn in flight across
    an upgrade is not reported as "resumed under a changed agent"."""
    from durable_agent.step.agents import changes

    recording = json.loads(path.read_text())
    runtime = Runtime(settings.model_copy(update=recording["settings"]))
    try:
        for turn in recording["turns"]:
            agent = runtime.agents[turn["agent"]]
            assert changes(turn["agent_spec"], agent.spec()) == [], path.name
            assert agent.digest == turn["agent_digest"], path.name
    finally:
        runtime.close()
