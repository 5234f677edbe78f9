"""What a worker checks about its settings before it takes a turn: names of tools it does
not have fail the start with one line (exit 2), instead of failing open later."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigurationError
from ..step.agents import BoundAgent
from ..step.faults import check_tools
from ..step.tools import ToolRegistry


def check_tool_names(
    approval_tools: Iterable[str],
    crash_at: tuple[int | str, str] | None,
    tools: ToolRegistry,
    agents: Iterable[BoundAgent],
) -> None:
    """A typo in DURABLE_AGENT_APPROVAL_REQUIRED would let the tool it meant run unasked;
    one in CRASH_AT would never fire: both are refused."""
    known = set(tools.names())
    for agent in agents:
        known.update(t.name for t in agent.tools)
    unknown = sorted(set(approval_tools) - known)
    if unknown:
        raise ConfigurationError(
            f"DURABLE_AGENT_APPROVAL_REQUIRED names no tool of this worker: "
            f"{', '.join(unknown)} (its tools: {', '.join(sorted(known)) or 'none'})"
        )
    check_tools(crash_at, known)  # type: ignore[arg-type]
