"""``tools_from_server``: an MCP server's tools as our ``Tool`` objects.

Listed once, when called (in a tools or agents module: at the worker's start), so that a
tool without a replay label refuses the start, named, like an unlabelled ``@tool``. Each
tool is then an ordinary ``Tool``: journaled, labelled, approvals, the crash matrix, spend
and the console apply. Its call goes to the process's session of the server
(``sessions.py``); its result is the text of the MCP result (``results.py``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ToolDefinitionError
from ..integrations.labels import check_no_unknown, check_replay_mapping, label_for
from ..step.tools import IDEMPOTENCY_PARAMETER, Replay, Tool, ToolSet
from . import sessions
from .results import arguments_model, result_text
from .servers import ServerSpec, server_spec

if TYPE_CHECKING:
    from mcp_types import Tool as McpTool

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class McpToolError(Exception):
    """An MCP tool answered ``isError``: the model reads the server's text as the tool's
    error (for a ``never`` tool: the call may or may not have happened, as the server may
    have acted before it failed)."""


class McpToolCall:
    """The function of one MCP tool: sends the call to this process's session."""

    def __init__(self, spec: ServerSpec, mcp_name: str, replay: Replay) -> None:
        self.spec = spec
        self.mcp_name = mcp_name
        self.replay = replay
        self.__qualname__ = mcp_name
        self.__module__ = f"MCP server {spec.name!r}"

    def __call__(self, **arguments: Any) -> str:
        session = sessions.session_for(self.spec)
        result = sessions.run(
            session.call_tool(self.mcp_name, arguments, resend=self.replay == "safe")
        )
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or f"{self.mcp_name} failed (isError, no text)")
        return text


def tools_from_server(
    name: str,
    *,
    command: str | Sequence[str] | None = None,
    url: str | None = None,
    replay: Mapping[str, str] | None = None,
    prefix: str = "",
    approval: Collection[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 30.0,
    call_timeout: float | None = 300.0,
) -> ToolSet:
    """The tools of an MCP server as durable-agent tools, listed now.

    Give exactly one of ``command`` (the server started over stdio, a list or a
    shell-split string) and ``url`` (streamable HTTP). Each tool's replay label is
    ``replay[name]`` if given, else what its annotations settle (``readOnlyHint`` -> safe;
    ``destructiveHint`` without ``idempotentHint`` -> never); a tool that neither settles
    raises ``ToolDefinitionError`` naming the server and the tool.

    Args:
        name: The server's name in errors and in the tools' origin.
        command: The command that starts the server (stdio).
        url: The server's streamable HTTP endpoint.
        replay: ``{"mcp_tool_name": "safe" | "never"}``, the server's tool names (without
            ``prefix``); it wins over the annotations; an unknown name is refused.
        prefix: Put before each tool's name as the model calls it (``"mail_"``), to keep two
            servers' tools, or a server's and yours, apart; 1-64 letters, digits, ``_``,
            ``-`` in all.
        approval: The server's tool names whose every call waits for a person's decision.
        env: Extra environment of the started server (merged over the MCP SDK's default
            environment, which holds little more than ``PATH`` and ``HOME``).
        cwd: The started server's working folder.
        headers: Extra HTTP headers for ``url`` (e.g. ``Authorization``).
        connect_timeout: Seconds to start or reach the server and open the session.
        call_timeout: Seconds one call may take (None: no limit); a call past it is the
            tool's error (for a ``never`` tool: uncertain).

    Returns:
        A ``ToolSet`` (a tuple of ``Tool``): pass it to ``Agent(tools=[*tool_set])``, or
        leave it at the top level of a tools module.
    """
    spec = server_spec(
        name,
        command=command,
        url=url,
        env=env,
        cwd=cwd,
        headers=headers,
        connect_timeout=connect_timeout,
        call_timeout=call_timeout,
    )
    where = f"MCP server {name!r}"
    labels = check_replay_mapping(replay, where=where)
    if not isinstance(prefix, str):
        raise ToolDefinitionError(f"{where}: prefix must be text")
    if isinstance(approval, str) or not all(isinstance(a, str) for a in approval):
        raise ToolDefinitionError(f"{where}: approval must be a list of the server's tool names")
    listed = sessions.list_server_tools(spec)
    names = [t.name for t in listed]
    check_no_unknown(labels, names, where=where)
    unknown = sorted(set(approval) - set(names))
    if unknown:
        raise ToolDefinitionError(
            f"{where}: approval names {', '.join(map(repr, unknown))}, which is no tool of it "
            f"(its tools: {', '.join(sorted(names)) or 'none'})"
        )
    built = [_tool(spec, t, labels, prefix, t.name in approval) for t in listed]
    seen: dict[str, str] = {}
    for t, listed_tool in zip(built, listed, strict=True):
        if t.name in seen:
            raise ToolDefinitionError(
                f"{where} lists two tools named {t.name!r} ({seen[t.name]!r} and "
                f"{listed_tool.name!r})"
            )
        seen[t.name] = listed_tool.name
    return ToolSet(built)


def _tool(
    spec: ServerSpec, listed: McpTool, labels: Mapping[str, Replay], prefix: str, approval: bool
) -> Tool:
    where = f"MCP server {spec.name!r}"
    label = label_for(listed.name, labels, where=where, annotations=listed.annotations)
    name = f"{prefix}{listed.name}"
    if not _NAME.match(name):
        raise ToolDefinitionError(
            f"{where}: tool {listed.name!r} is called {name!r}, which is not 1-64 letters, "
            "digits, '_' or '-' (OpenAI's rule for tool names)"
        )
    schema, wants_key = _model_schema(listed.input_schema)
    try:
        arguments = arguments_model(_model_name(name), schema)
    except ValueError as error:
        raise ToolDefinitionError(f"{where}: tool {listed.name!r}: {error}") from None
    return Tool(
        name=name,
        replay=label,
        function=McpToolCall(spec, listed.name, label),
        description=(listed.description or listed.title or listed.name).strip(),
        arguments=arguments,
        wants_idempotency_key=wants_key,
        module=f"MCP server {spec.name!r}",
        approval="required" if approval else "none",
    )


def _model_schema(input_schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema the model sees (an ``idempotency_key`` property taken out: the runner
    fills it with the call's key) and whether the tool takes one."""
    schema = copy.deepcopy(dict(input_schema))
    schema.setdefault("type", "object")
    properties = schema.get("properties")
    if not isinstance(properties, dict) or IDEMPOTENCY_PARAMETER not in properties:
        schema.setdefault("properties", {} if properties is None else properties)
        return schema, False
    del properties[IDEMPOTENCY_PARAMETER]
    required = schema.get("required")
    if isinstance(required, list):
        schema["required"] = [r for r in required if r != IDEMPOTENCY_PARAMETER]
    return schema, True


def _model_name(name: str) -> str:
    return "".join(part.title() for part in re.split(r"[_-]", name) if part) + "Arguments"
