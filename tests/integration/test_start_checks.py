"""A worker refuses to start, with one line and exit 2, on names in its settings that name
nothing it has: a crash point for a tool it lacks, an approval for a tool it lacks."""

from __future__ import annotations

import pytest
from inprocess import run_cli

from durable_agent.settings import Settings

TOOLS = "durable_agent_examples.email_tools"


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_crash_at_a_tool_the_worker_lacks_stops_the_start(settings: Settings) -> None:
    """CRASH_AT=send_emial:after_run would never fire: the start is refused, naming the
    forms CRASH_AT takes, delivery:before_claim among them."""
    result = run_cli(settings, "worker", DURABLE_AGENT_TOOLS=TOOLS, CRASH_AT="send_emial:after_run")
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result.stderr)
    assert "send_emial" in line and "send_email" in line  # what it has
    assert "delivery:before_claim" in line


def test_a_malformed_crash_at_names_delivery_before_claim(settings: Settings) -> None:
    result = run_cli(settings, "worker", DURABLE_AGENT_TOOLS=TOOLS, CRASH_AT="4:during_run")
    assert result.returncode == 2, result.stderr
    assert "delivery:before_claim" in _one_error_line(result.stderr)


@pytest.mark.parametrize("names", ["send_emial", "send_email, refund_order"])
def test_approval_required_for_a_tool_the_worker_lacks_stops_the_start(
    settings: Settings, names: str
) -> None:
    """A typo in DURABLE_AGENT_APPROVAL_REQUIRED used to be ignored, and the tool it meant
    ran without approval: now the start is refused, naming the unknown names."""
    result = run_cli(
        settings, "worker", DURABLE_AGENT_TOOLS=TOOLS, DURABLE_AGENT_APPROVAL_REQUIRED=names
    )
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result.stderr)
    assert "DURABLE_AGENT_APPROVAL_REQUIRED" in line
    unknown = "send_emial" if "emial" in names else "refund_order"
    assert unknown in line
