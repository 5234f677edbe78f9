"""The tool registry: every tool declares whether it may run again after a crash.

``@tool(replay="safe")`` marks a tool that may run again when a crash interrupted it (a
lookup). ``@tool(replay="never")`` marks a tool that must never run twice (a refund, an
email): when a crash interrupted it, the model is told the call may or may not have happened.
The label is required; a missing or misspelled label, or a second tool with a taken name,
raises :class:`~durable_agent.errors.ToolDefinitionError` when the module is imported.

The JSON schema the model sees comes from the type hints and the docstring (Google style
``Args:`` section). A keyword-only ``idempotency_key: str`` parameter is filled in by the
runner with a key stable for the call, and is hidden from the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import pydantic

from ..errors import ConfigurationError, ToolDefinitionError

Replay = Literal["safe", "never"]
LABELS: tuple[Replay, ...] = ("safe", "never")
Approval = Literal["none", "required"]
IDEMPOTENCY_PARAMETER = "idempotency_key"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MISSING: Any = object()


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its replay label and argument schema."""

    name: str
    replay: Replay
    function: Callable[..., Any]
    description: str
    arguments: type[pydantic.BaseModel]
    wants_idempotency_key: bool
    module: str = field(default="")
    approval: Approval = "none"  # "required": the turn waits for a person's yes (approvals.py)
    # a waiting tool (step/wait_steps.py): its call is a wait step, parked until what this
    # returns for the call's arguments comes (a time, an event, a child agent's reply)
    wait: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function (tools stay usable as ordinary functions)."""
        return self.function(*args, **kwargs)

    @property
    def parameters_schema(self) -> dict[str, Any]:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def openai_schema(self) -> dict[str, Any]:
        """The entry for this tool in a Chat Completions ``tools`` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters_schema,
            },
        }

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The values the function receives for the model's arguments, converted to the
        declared types (``"42"`` for an ``int`` is 42); raises pydantic.ValidationError."""
        return dict(self.arguments.model_validate(arguments))

    def recorded_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """What the journal records for a call: the converted values (defaults included) as
        JSON; validating them again gives the same values. Raises pydantic.ValidationError."""
        recorded: dict[str, Any] = self.arguments.model_validate(arguments).model_dump(mode="json")
        return recorded

    def invoke(self, arguments: dict[str, Any], idempotency_key: str | None) -> Any:
        """Call the function with the arguments converted to its declared types."""
        kwargs = self.validate(arguments)
        if self.wants_idempotency_key:
            kwargs[IDEMPOTENCY_PARAMETER] = idempotency_key
        result = self.function(**kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


# Every tool defined in this process, by name, so a second tool with a taken name fails at import.
_defined: dict[str, Tool] = {}


def tool(
    function: Callable[..., Any] | None = None,
    *,
    replay: Replay = _MISSING,
    name: str | None = None,
    approval: Approval = "none",
    **unknown: Any,
) -> Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool(replay="safe")`` or ``@tool(replay="never")`` on a function.

    The JSON schema the model sees is built from the function's type hints and its
    docstring (the summary, and an ``Args:`` section for the parameters). A keyword-only
    parameter ``idempotency_key`` is filled with a key stable for the (turn, step), which the
    model never sees. A missing or unknown label, two tools with one name, a parameter
    without a type hint, or ``*args`` fail at import with ``ToolDefinitionError``.

    Args:
        replay: Required, no default. ``"safe"``: may run again if a crash interrupted it
            (a lookup). ``"never"``: never runs twice (a refund, an email); an interrupted
            call is answered "may or may not have happened" instead.
        name: The name the model calls it by (default: the function's name); 1-64
            letters, digits, ``_`` or ``-``.
        approval: ``"required"``: each call waits for a person's decision before it runs
            (``durable-agent approve`` / ``deny``). Default ``"none"``.

    Returns:
        A decorator that registers the function and returns its ``Tool``.
    """
    if unknown:
        raise ToolDefinitionError(
            f"tool() got unknown argument(s) {', '.join(sorted(unknown))}; "
            "declare tools as @tool(replay='safe') or @tool(replay='never')"
        )
    if function is not None:
        raise ToolDefinitionError(
            f"@tool on {getattr(function, '__qualname__', function)!r} needs a replay label: "
            "@tool(replay='safe') if it may run again after a crash, "
            "@tool(replay='never') if it must never run twice"
        )

    def decorate(fn: Callable[..., Any]) -> Tool:
        if replay is _MISSING:
            raise ToolDefinitionError(
                f"@tool on {fn.__qualname__!r} needs a replay label: "
                "@tool(replay='safe') or @tool(replay='never'); there is no default"
            )
        if replay not in LABELS:
            raise ToolDefinitionError(
                f"@tool on {fn.__qualname__!r}: replay must be 'safe' or 'never', got {replay!r}"
            )
        if approval not in ("none", "required"):
            raise ToolDefinitionError(
                f"@tool on {fn.__qualname__!r}: approval must be 'none' or 'required', "
                f"got {approval!r}"
            )
        built = dataclasses.replace(_build(fn, replay, name or fn.__name__), approval=approval)
        _register(built)
        return built

    return decorate


def _register(new: Tool) -> None:
    old = _defined.get(new.name)
    if old is not None and _origin(old) != _origin(new):
        raise ToolDefinitionError(
            f"two tools are named {new.name!r}: {_origin(old)} and {_origin(new)}; "
            "pass name='...' to one of them"
        )
    _defined[new.name] = new


def _origin(t: Tool) -> str:
    return f"{t.module}.{t.function.__qualname__}"


def _build(fn: Callable[..., Any], replay: Replay, name: str) -> Tool:
    if not _NAME.match(name):
        raise ToolDefinitionError(
            f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' (OpenAI's rule)"
        )
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as error:
        raise ToolDefinitionError(f"tool {name!r}: cannot read its type hints: {error}") from error
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    wants_key = False
    for param in signature.parameters.values():
        if param.name == IDEMPOTENCY_PARAMETER:
            if param.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise ToolDefinitionError(
                    f"tool {name!r}: idempotency_key must be keyword-only (put it after *)"
                )
            wants_key = True
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name!r}: *args and **kwargs cannot be described")
        if param.name not in hints:
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {param.name!r} needs a type hint for its schema"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (
            hints[param.name],
            pydantic.Field(default, description=arg_docs.get(param.name)),
        )
    model_name = "".join(part.title() for part in re.split(r"[_-]", name)) + "Arguments"
    arguments = pydantic.create_model(
        model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    return Tool(
        name=name,
        replay=replay,
        function=fn,
        description=summary or name.replace("_", " "),
        arguments=arguments,
        wants_idempotency_key=wants_key,
        module=fn.__module__,
    )


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and per-argument text."""
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line.strip())
        if header and not line.startswith(" "):
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            entry = re.match(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if entry and (current is None or _indent(line) <= _indent_of_first(doc, section)):
                current = entry.group(1)
                args[current] = entry.group(2).strip()
            elif current and line.strip():
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), args


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indent_of_first(doc: str, section: str) -> int:
    lines = doc.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == f"{section}:":
            for following in lines[index + 1 :]:
                if following.strip():
                    return _indent(following)
    return 0


class ToolSet(tuple[Tool, ...]):
    """Tools defined together, e.g. an MCP server's (``durable_agent.mcp``): a tools module
    that holds one at its top level offers each of its tools, as it offers a ``Tool``, and
    an agent takes them as ``tools=[*tool_set]``."""

    def named(self, name: str) -> Tool:
        """The tool of this set with this name; raises KeyError naming the known ones."""
        for t in self:
            if t.name == name:
                return t
        raise KeyError(f"no tool named {name!r} here (known: {', '.join(t.name for t in self)})")


class ToolRegistry:
    """The tools one worker offers the model, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[dict[str, Any]] | None = None
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> None:
        if t.name in self._tools and self._tools[t.name] is not t:
            raise ToolDefinitionError(
                f"two tools are named {t.name!r}: {_origin(self._tools[t.name])} and {_origin(t)}"
            )
        self._tools[t.name] = t
        self._schemas = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> typing.Iterator[Tool]:
        return iter(self._tools[name] for name in sorted(self._tools))

    def openai_schemas(self) -> list[dict[str, Any]]:
        """The Chat Completions ``tools`` list, built once (pydantic's schema generation is
        slow) and shared: treat it as read-only."""
        if self._schemas is None:
            self._schemas = [t.openai_schema() for t in self]
        return self._schemas

    def relabelled(self, labels: dict[str, Replay]) -> ToolRegistry:
        """A copy with some labels changed (the evals use it to show a wrong label)."""
        from dataclasses import replace

        unknown = set(labels) - set(self._tools)
        if unknown:
            raise ConfigurationError(
                f"cannot relabel unknown tool(s): {', '.join(sorted(unknown))}"
            )
        return ToolRegistry(
            replace(t, replay=labels[t.name]) if t.name in labels else t for t in self
        )


def load_tools(module_names: Iterable[str], labels: dict[str, str] | None = None) -> ToolRegistry:
    """Import the named modules and collect the tools they define, each ``Tool`` and each
    tool of a ``ToolSet`` at their top level (labels overridden)."""
    registry = ToolRegistry()
    for module_name in module_names:
        module = import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, Tool):
                registry.add(value)
            elif isinstance(value, ToolSet):
                for t in value:
                    registry.add(t)
    if labels:
        bad = {name: label for name, label in labels.items() if label not in LABELS}
        if bad:
            raise ConfigurationError(f"tool labels must be 'safe' or 'never', got {bad}")
        registry = registry.relabelled(labels)  # type: ignore[arg-type]
    return registry


def import_module(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ToolDefinitionError:
        raise
    except ModuleNotFoundError as error:
        raise ConfigurationError(
            f"cannot import tools module {module_name!r} (DURABLE_AGENT_TOOLS or _AGENTS): {error}"
        ) from error
    except Exception as error:
        raise ConfigurationError(
            f"importing tools module {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
