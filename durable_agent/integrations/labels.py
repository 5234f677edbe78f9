"""The replay label of a tool declared elsewhere: a function tool of another framework, or a
tool of an MCP server.

Our own tools carry their label in ``@tool(replay=...)``; a tool that comes from elsewhere
gets it from the ``replay={"tool_name": "safe" | "never"}`` mapping its integration is given,
or, for an MCP tool, from the server's annotations where they settle it:

- ``readOnlyHint: true`` settles ``safe`` (reading twice changes nothing);
- ``destructiveHint: true`` without ``idempotentHint: true`` settles ``never``.

Anything else (no annotations, a destructive but idempotent tool, an additive tool) settles
nothing: without an entry in ``replay`` the agent refuses to start, naming the tool, as a
``@tool`` without a label fails at import. An entry in ``replay`` wins over the annotations:
the MCP specification calls annotations hints a client must not trust, and the label is the
user's promise about the tool's effect. A name in ``replay`` that matches no tool is refused
too: a misspelled entry must not leave the real tool unlabelled.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ToolDefinitionError
from ..step.tools import LABELS, Replay


def check_replay_mapping(replay: Mapping[str, str] | None, *, where: str) -> dict[str, Replay]:
    """``replay`` as a dict, every value a known label; raises ToolDefinitionError."""
    if replay is None:
        return {}
    if not isinstance(replay, Mapping):
        raise ToolDefinitionError(
            f"{where}: replay must be a mapping of tool names to 'safe' or 'never', "
            f"not {type(replay).__name__}"
        )
    checked: dict[str, Replay] = {}
    for name, label in replay.items():
        if label not in LABELS:
            raise ToolDefinitionError(
                f"{where}: replay[{name!r}] is {label!r}; a tool's label is 'safe' or 'never'"
            )
        checked[str(name)] = label
    return checked


def _hint(annotations: Any, name: str) -> bool | None:
    """One boolean hint of MCP ``ToolAnnotations`` (an object or a mapping), or None. The
    wire name is camelCase (``readOnlyHint``); mcp 2's models name the attribute in
    snake_case (``read_only_hint``): either is read."""
    if annotations is None:
        return None
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    if isinstance(annotations, Mapping):
        value = annotations.get(name, annotations.get(snake))
    else:
        value = getattr(annotations, name, getattr(annotations, snake, None))
    return value if isinstance(value, bool) else None


def label_from_annotations(annotations: Any) -> Replay | None:
    """The label MCP tool annotations settle, or None when they settle none."""
    if _hint(annotations, "readOnlyHint") is True:
        return "safe"
    if (
        _hint(annotations, "destructiveHint") is True
        and _hint(annotations, "idempotentHint") is not True
    ):
        return "never"
    return None


def label_for(
    tool_name: str,
    replay: Mapping[str, Replay],
    *,
    where: str,
    annotations: Any = None,
) -> Replay:
    """The label of one tool: ``replay[tool_name]``, else what its annotations settle;
    raises ToolDefinitionError naming the tool when neither gives one."""
    if tool_name in replay:
        return replay[tool_name]
    settled = label_from_annotations(annotations)
    if settled is not None:
        return settled
    raise ToolDefinitionError(
        f"{where}: tool {tool_name!r} has no replay label; give it one with "
        f"replay={{{tool_name!r}: 'safe' | 'never'}} ('safe': may run again after a crash, "
        "'never': must never run twice)"
    )


def check_no_unknown(
    replay: Mapping[str, Replay], tool_names: Collection[str], *, where: str
) -> None:
    """Refuse entries of ``replay`` that name no tool (a misspelled name)."""
    unknown = sorted(set(replay) - set(tool_names))
    if unknown:
        known = ", ".join(sorted(tool_names)) or "none"
        raise ToolDefinitionError(
            f"{where}: replay names {', '.join(map(repr, unknown))}, which is no tool of it "
            f"(its tools: {known})"
        )
