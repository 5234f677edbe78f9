"""Pins the public names of the durable_agent package."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import durable_agent

EXPECTED = [
    "Agent",
    "CallContext",
    "ChildTurnFailed",
    "ConfigurationError",
    "DurableAgentError",
    "EventResult",
    "EventSent",
    "InvalidArgument",
    "KeyProvider",
    "KeyUnavailable",
    "LeaseLost",
    "Loop",
    "ModelUnavailable",
    "PayloadTampered",
    "ReplayDiverged",
    "Runtime",
    "ServiceUnavailable",
    "Settings",
    "Step",
    "StepLimitReached",
    "Tool",
    "ToolDefinitionError",
    "Turn",
    "TurnContext",
    "TurnEnded",
    "TurnEvent",
    "TurnFailed",
    "TurnNotFound",
    "TurnStatus",
    "agent_tool",
    "agent_turn",
    "approve",
    "audit_trail",
    "cancel_turn",
    "current_call",
    "deny",
    "event_tool",
    "get_turn",
    "list_approvals",
    "list_events",
    "list_uncertain",
    "prune",
    "rekey",
    "resolve_uncertain",
    "run_turn",
    "runtime_for",
    "send_event",
    "start_turn",
    "still_claimed",
    "stream_turn",
    "tool",
    "wait_for_event",
    "wait_for_turn",
    "wait_seconds",
]


def test_all_is_pinned() -> None:
    """__all__ is exactly this sorted list: adding or removing a public name is deliberate."""
    assert durable_agent.__all__ == EXPECTED
    assert sorted(EXPECTED) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_each_name_is_importable(name: str) -> None:
    """`from durable_agent import <name>` works for every public name."""
    module = importlib.import_module("durable_agent")
    value = getattr(module, name)
    assert value is not None
    namespace: dict[str, object] = {}
    exec(f"from durable_agent import {name}", namespace)
    assert namespace[name] is value


def test_errors_form_the_documented_tree() -> None:
    """Every error derives from DurableAgentError; the sub-trees are as documented."""
    da = durable_agent
    assert issubclass(da.ToolDefinitionError, da.ConfigurationError)
    assert issubclass(da.ReplayDiverged, da.TurnFailed)
    assert issubclass(da.StepLimitReached, da.TurnFailed)
    errors = (
        da.ConfigurationError,
        da.ServiceUnavailable,
        da.TurnNotFound,
        da.TurnFailed,
        da.ModelUnavailable,
        da.LeaseLost,
    )
    for error in errors:
        assert issubclass(error, da.DurableAgentError)
    retryable = {e.__name__ for e in (*errors, da.ToolDefinitionError) if e.retryable}
    assert retryable == {"LeaseLost", "ModelUnavailable", "ServiceUnavailable"}


def test_run_turn_is_lazy_and_a_celery_task() -> None:
    """Importing the package does not import the Celery task module; asking for run_turn does."""
    code = (
        "import sys, durable_agent\n"
        "print('tasks' if 'durable_agent.tasks' in sys.modules else 'no-tasks')\n"
        "from durable_agent import run_turn\n"
        "print(run_turn.name)\n"
        "print(callable(run_turn.delay))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["no-tasks", "durable_agent.run_turn", "True"]


def test_unknown_attribute_raises_attribute_error() -> None:
    """A name the package does not have is an AttributeError naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = durable_agent.no_such_name


def test_beat_schedule_runs_the_sweeper() -> None:
    """`celery -A durable_agent.tasks beat` sweeps every sweep interval out of the box."""
    from durable_agent.delivery.celery_tasks import SWEEP as SWEEP_TASK_NAME
    from durable_agent.tasks import app, runtime

    entry = app.conf.beat_schedule["durable-agent-sweep"]
    assert entry == {"task": SWEEP_TASK_NAME, "schedule": runtime.settings.sweep_interval_seconds}
    assert SWEEP_TASK_NAME in app.tasks


def test_the_worker_imports_no_sqlalchemy() -> None:
    """The hot path stays on psycopg: `celery -A durable_agent.tasks`, a turn worker and the
    sweeper import nothing of SQLAlchemy or Alembic (only durable_agent.schema and
    start_turn(connection=<a SQLAlchemy object>) do, in the application)."""
    code = (
        "import sys, durable_agent.tasks, durable_agent.delivery.turn_worker\n"
        "import durable_agent.delivery.sweeper, durable_agent.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_schema_is_a_module_for_applications() -> None:
    """`import durable_agent.schema`: the metadata, the Alembic filter and the upgrade helper;
    start_turn takes the application's connection."""
    import inspect

    import durable_agent.schema

    assert durable_agent.schema.__all__ == ["TABLES", "include_object", "metadata", "upgrade"]
    assert "turns" in durable_agent.schema.metadata.tables
    parameter = inspect.signature(durable_agent.start_turn).parameters["connection"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is None
