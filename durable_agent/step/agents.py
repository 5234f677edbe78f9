"""Agents: several on one database and queue set, each with its own model, instructions,
tools, queue, limits and loop.

Define them in a module of yours (``DURABLE_AGENT_AGENTS``, or a tools module)::

    billing = Agent(
        "billing",
        model="gpt-4.1",
        instructions="You handle refunds. Check an order before you refund it.",
        tools=[get_order, refund_order],          # Tool objects or names
        queue="billing",
        max_steps=20,
        parameters={"temperature": 0},
    )

``start_turn(session_id, message, agent="billing")`` records which agent a turn belongs to;
workers serve the agents of the queues they consume. The agent configured by the
environment (``DURABLE_AGENT_MODEL``, ``..._SYSTEM_PROMPT``, ``..._TOOLS``, ``..._QUEUE``,
``..._MAX_STEPS``) is named ``default`` and needs no definition.

Each turn records a digest of its agent when it first runs (see :meth:`BoundAgent.spec`:
model, instructions, parameters, step cap, loop, and every tool's name, label and schema).
A turn that resumes under an agent with another digest (a deploy changed it mid-turn) goes
on with the agent as it is now; what changed is logged and recorded on the turn.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, InvalidArgument
from ..journal import digest
from .loop import Api, BudgetBook, Loop, ModelCall, TokenSink, TurnContext, TurnInput, loop_name
from .responses import responses_loop
from .tools import Tool, ToolRegistry
from .wait_steps import agent_tool

if TYPE_CHECKING:
    from ..journal import Turn
    from ..settings import Settings
    from .runner import StepRunner

DEFAULT_AGENT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_RESERVED_PARAMETERS = frozenset({"model", "messages", "tools", "stream"})


@dataclass(frozen=True)
class Agent:
    """An agent definition. Every field but the name falls back to the environment's
    setting (``DURABLE_AGENT_MODEL``, ``..._SYSTEM_PROMPT``, all tools, ``..._QUEUE``,
    ``..._MAX_STEPS``, the built-in Chat Completions loop).

    Define agents in a module named by ``DURABLE_AGENT_AGENTS`` (or in a tools module); a
    bad field raises ``ConfigurationError`` when the agent is defined.

    Attributes:
        name: 1-64 letters, digits, ``_``, ``.`` or ``-``; ``start_turn(..., agent=name)``.
            The agent configured by the environment is named ``default``.
        model: The model name sent to Chat Completions.
        instructions: The system prompt.
        tools: The tools it may call, as ``Tool`` objects or names (a subset of the
            registry); an ``Agent`` here is a tool that asks that agent (a child turn).
        queue: The Celery queue its turns are sent to.
        max_steps: Step cap of its turns.
        parameters: Model parameters sent with every request, e.g. ``{"temperature": 0}``.
        loop: The function that runs a turn (``Loop``); default: the built-in loop of
            its ``api``.
        api: ``"chat"`` (Chat Completions, the default) or ``"responses"`` (the Responses
            API: reasoning items and function calls are journalled as output items).
        stream: Whether the built-in loop streams the model's answers to the turn's
            watchers (default ``DURABLE_AGENT_STREAM``, on).
        concurrency_key: A function of the session id giving the turn's concurrency key
            (e.g. the tenant) when ``start_turn`` is given none; see
            ``DURABLE_AGENT_CONCURRENCY_PER_KEY``.
        events: The names of the events its turns wait for (``ctx.wait_for_event``), if
            you declare them: ``send_event`` then refuses any other name at once, and a
            wait for an undeclared name fails the turn. None (default): any name.
    """

    name: str
    model: str | None = None
    instructions: str | None = None
    tools: Sequence[Tool | str | Agent] | None = None
    queue: str | None = None
    max_steps: int | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    loop: Loop | None = None
    api: Api = "chat"
    stream: bool | None = None
    concurrency_key: Callable[[str], str | None] | None = None
    events: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigurationError(
                f"agent name {self.name!r} must be 1-64 letters, digits, '_', '.' or '-'"
            )
        where = f"agent {self.name!r}"
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ConfigurationError(f"{where}: model must be a non-empty name")
        if self.queue is not None and (
            not isinstance(self.queue, str) or not _NAME.match(self.queue)
        ):
            raise ConfigurationError(f"{where}: queue {self.queue!r} is not a queue name")
        if self.max_steps is not None and (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or not 1 <= self.max_steps <= 100_000
        ):
            raise ConfigurationError(f"{where}: max_steps must be a whole number from 1 to 100000")
        if self.tools is not None:
            if isinstance(self.tools, str | Tool) or not all(
                isinstance(t, str | Tool | Agent) for t in self.tools
            ):
                raise ConfigurationError(
                    f"{where}: tools must be a list of tools, tool names or agents"
                )
            object.__setattr__(self, "tools", tuple(self.tools))
        reserved = _RESERVED_PARAMETERS & set(self.parameters)
        if reserved:
            raise ConfigurationError(
                f"{where}: parameters may not set {', '.join(sorted(reserved))} (the agent's "
                "model and tools set them)"
            )
        try:
            json.dumps(dict(self.parameters))
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"{where}: parameters must be JSON values: {error}") from None
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))
        if self.api not in ("chat", "responses"):
            raise ConfigurationError(f"{where}: api must be 'chat' or 'responses'")
        if self.stream is not None and not isinstance(self.stream, bool):
            raise ConfigurationError(f"{where}: stream must be True or False")
        if self.concurrency_key is not None and not callable(self.concurrency_key):
            raise ConfigurationError(f"{where}: concurrency_key must be a function of the session")
        if self.events is not None:
            if isinstance(self.events, str) or not all(
                isinstance(e, str) and e and e.isprintable() and len(e) <= 200 for e in self.events
            ):
                raise ConfigurationError(f"{where}: events must be a list of event names")
            object.__setattr__(self, "events", tuple(self.events))
        if self.loop is not None and not callable(self.loop):
            raise ConfigurationError(f"{where}: loop must be a function of the turn's context")


@dataclass(frozen=True)
class BoundAgent:
    """An agent with every setting resolved: what a worker runs a turn with."""

    name: str
    model: str
    instructions: str
    tools: ToolRegistry
    queue: str
    max_steps: int
    parameters: Mapping[str, Any]
    loop: Loop
    events: tuple[str, ...] | None = None  # the event names its turns wait for (None: any)
    api: Api = "chat"
    stream: bool = False
    concurrency_key: Callable[[str], str | None] | None = None

    def key_for(self, session_id: str) -> str | None:
        """The concurrency key this agent derives for a new turn of ``session_id``."""
        if self.concurrency_key is None:
            return None
        key = self.concurrency_key(session_id)
        if key is not None and not isinstance(key, str):
            raise ConfigurationError(
                f"agent {self.name!r}: concurrency_key returned {type(key).__name__}, not text"
            )
        return key

    def spec(self) -> dict[str, Any]:
        """What the agent's digest covers, as recorded on each turn (a copy)."""
        return copy.deepcopy(self._spec)

    @cached_property
    def _spec(self) -> dict[str, Any]:
        # built once per worker: the tool schemas come from pydantic, which is slow
        spec = {
            "model": self.model,
            "instructions_sha256": digest(self.instructions),
            "parameters": dict(self.parameters),
            "max_steps": self.max_steps,
            "loop": loop_name(self.loop),
            "tools": {
                t.name: {"replay": t.replay, "schema_sha256": digest(t.openai_schema())}
                for t in self.tools
            },
        }
        if self.api != "chat":  # absent for Chat Completions: older digests stay the same
            spec["api"] = self.api
        if self.events is not None:  # absent when not declared: older digests stay the same
            spec["events"] = sorted(self.events)
        return spec

    @cached_property
    def digest(self) -> str:
        return digest(self._spec)

    def context(
        self,
        runner: StepRunner,
        call_model: ModelCall,
        turn: Turn,
        history: list[tuple[str, str]],
        tokens: TokenSink | None = None,
        budgets: BudgetBook | None = None,
    ) -> TurnContext:
        """The context this agent's loop gets for one delivery of ``turn``."""
        return TurnContext(
            runner,
            call_model=call_model,
            turn=TurnInput(turn.turn_id, turn.session_id, turn.message, history),
            agent=self.name,
            model=self.model,
            instructions=self.instructions,
            tools=self.tools,
            parameters=self.parameters,
            api=self.api,
            streaming=self.stream,
            tokens=tokens,
            budgets=budgets,
            events=self.events,
        )


def changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two agent specs, in words (empty when nothing does)."""
    found: list[str] = []
    for key, what in (("model", "model"), ("max_steps", "max_steps"), ("loop", "loop")):
        if recorded.get(key) != current.get(key):
            found.append(f"{what} {recorded.get(key)} -> {current.get(key)}")
    if recorded.get("instructions_sha256") != current.get("instructions_sha256"):
        found.append("instructions changed")
    if recorded.get("parameters") != current.get("parameters"):
        found.append(
            f"parameters {json.dumps(recorded.get('parameters'), sort_keys=True)} -> "
            f"{json.dumps(current.get('parameters'), sort_keys=True)}"
        )
    old_tools: Mapping[str, Any] = recorded.get("tools") or {}
    new_tools: Mapping[str, Any] = current.get("tools") or {}
    for name in sorted(set(old_tools) | set(new_tools)):
        old, new = old_tools.get(name), new_tools.get(name)
        if old is None:
            found.append(f"tool {name} added")
        elif new is None:
            found.append(f"tool {name} removed")
        else:
            if old.get("replay") != new.get("replay"):
                found.append(f"tool {name} relabelled {old.get('replay')} -> {new.get('replay')}")
            if old.get("schema_sha256") != new.get("schema_sha256"):
                found.append(f"tool {name} schema changed")
    return found


class AgentBook:
    """The agents a process knows, by name, and the ones its workers serve."""

    def __init__(self, agents: Iterable[BoundAgent], serve: Sequence[str] = ()) -> None:
        self._agents = {a.name: a for a in agents}
        unknown = sorted(set(serve) - set(self._agents))
        if unknown:
            raise ConfigurationError(
                f"no agent named {', '.join(map(repr, unknown))} (DURABLE_AGENT_SERVE_AGENTS, "
                f"--agent); known: {', '.join(self.names())}"
            )
        queues = {self._agents[n].queue for n in serve} if serve else None
        # a worker serves every agent of the queues it consumes, so that no turn it takes
        # from its queue is one it must hand back
        self.served = {n for n, a in self._agents.items() if queues is None or a.queue in queues}

    def names(self) -> list[str]:
        return sorted(self._agents)

    def get(self, name: str) -> BoundAgent | None:
        return self._agents.get(name)

    def __getitem__(self, name: str) -> BoundAgent:
        agent = self._agents.get(name)
        if agent is None:
            raise InvalidArgument(f"no agent named {name!r}; known: {', '.join(self.names())}")
        return agent

    def serves(self, name: str) -> bool:
        return name in self.served

    @cached_property
    def served_specs(self) -> str:
        """JSON of the served agents' digests and specs by name: a claim records them on a
        turn's first run in the same statement (``claim_turn``)."""
        return json.dumps(
            {
                n: {"digest": self._agents[n].digest, "spec": self._agents[n].spec()}
                for n in sorted(self.served)
            },
            sort_keys=True,
        )

    @property
    def queues(self) -> list[str]:
        """The queues of the served agents."""
        return sorted({self._agents[n].queue for n in self.served})

    def __iter__(self) -> Iterator[BoundAgent]:
        return iter(self._agents[n] for n in self.names())


def find_agents(modules: Iterable[Any]) -> list[Agent]:
    """The Agent objects defined at the top level of these modules."""
    found: dict[str, Agent] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, Agent):
                old = found.get(value.name)
                if old is not None and old is not value:
                    raise ConfigurationError(
                        f"two agents are named {value.name!r} (in {module.__name__} and before)"
                    )
                found[value.name] = value
    return list(found.values())


def bind(
    agent: Agent, settings: Settings, registry: ToolRegistry, default_loop: Loop
) -> BoundAgent:
    """Resolve an agent's settings and tools (names are looked up in the registry)."""
    if agent.tools is None:
        tools = registry
    else:
        chosen: list[Tool] = []
        for item in agent.tools:
            if isinstance(item, Agent):  # another agent, asked through a child turn
                chosen.append(agent_tool(item))
                continue
            name = item if isinstance(item, str) else item.name
            found = registry.get(name)
            if found is None and isinstance(item, Tool):
                found = item
            if found is None:
                raise ConfigurationError(
                    f"agent {agent.name!r} lists tool {name!r}, which no tools module defines "
                    f"(known: {', '.join(registry.names()) or 'none'})"
                )
            chosen.append(found)
        tools = ToolRegistry(chosen)
    return BoundAgent(
        name=agent.name,
        model=agent.model or settings.model,
        instructions=settings.system_prompt if agent.instructions is None else agent.instructions,
        tools=tools,
        queue=agent.queue or settings.queue,
        max_steps=agent.max_steps or settings.max_steps,
        parameters=agent.parameters,
        loop=agent.loop or (responses_loop if agent.api == "responses" else default_loop),
        api=agent.api,
        stream=settings.stream if agent.stream is None else agent.stream,
        concurrency_key=agent.concurrency_key,
        events=tuple(agent.events) if agent.events is not None else None,
    )


def check_agent_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(f"agent must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
    return name
