"""A crash-matrix scenario: your agent, your message, your tools' side effects.

``durable-agent eval crash-matrix --scenario myapp.scenarios:refund`` (or the pytest
plugin's ``crash_matrix`` fixture) runs the scenario's turn once cleanly, then once per
step and crash point (``before_run``, ``after_run``) with a real worker that dies exactly
there, and lets fresh workers finish it. At every point it counts what the pattern asks
for: model calls repeated for finished steps (a scripted model counts them), each ``never``
tool's side effects (your counters), and whether the reply is the clean run's.

A scenario names:

``message``      the user's message of the turn
``effects``      for each ``never`` tool, a function returning how many times its effect
                 happened so far (ask the sandbox, the test inbox, the test account)
``modules``      the modules workers import (``DURABLE_AGENT_TOOLS``: tools and agents)
``agent``        the agent to run (``None``: ``default``)
``policy``       the scripted model: a policy function, ``"module:function"`` or a built-in
                 name (``email``, ``refund``); ``None`` uses the real endpoint of
                 ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (repeats are then not counted)
``services``     context managers started around the whole run (a sandbox, an inbox)
``env``          the workers' extra environment, or a function giving it once the
                 services run (their URLs)
``reset``        called before every run, to clear the counters (the inbox, the sandbox)
``expected``     effects per tool of one clean run (default 1 each)

Write it as a module-level ``Scenario`` or a function that returns one (called once per
run, so each run gets fresh servers).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from .model_server import Policy, policy_problem

__all__ = ["Scenario", "load_object", "load_scenario"]


@dataclass
class Scenario:
    """What a crash matrix runs and counts: your agent, your message, your tools' effects.

    Write it as a module-level ``Scenario`` or a function that returns one (called once per
    run, so each run gets fresh servers); ``durable-agent eval crash-matrix --scenario
    module:name`` and the pytest plugin's ``crash_matrix`` fixture run it.

    Attributes:
        message: The user's message of the turn.
        effects: For each ``never`` tool, a function returning how many times its effect
            happened so far (ask the sandbox, the test inbox, the test account).
        modules: The modules workers import (``DURABLE_AGENT_TOOLS``: tools and agents).
        agent: The agent to run (``None``: ``default``).
        policy: The scripted model: a policy function, ``"module:function"`` or a built-in
            name (``email``, ``refund``); ``None`` uses the real endpoint of
            ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (repeats are then not counted).
        services: Context managers started around the whole run (a sandbox, an inbox).
        env: The workers' extra environment, or a function giving it once the services
            run (their URLs).
        reset: Called before every run, to clear the counters (the inbox, the sandbox).
        expected: Effects per tool of one clean run (default 1 each).
        name: The scenario's name in the report.
    """

    message: str
    effects: Mapping[str, Callable[[], int]]
    modules: Sequence[str] = ()
    agent: str | None = None
    policy: Policy | str | None = None
    services: Sequence[AbstractContextManager[Any]] = ()
    env: Mapping[str, str] | Callable[[], Mapping[str, str]] = field(default_factory=dict)
    reset: Callable[[], None] | None = None
    expected: Mapping[str, int] = field(default_factory=dict)
    name: str = "scenario"

    def __post_init__(self) -> None:
        if not isinstance(self.message, str) or not self.message.strip():
            raise ConfigurationError(f"scenario {self.name!r}: message must be non-empty text")
        if not self.effects or not all(callable(count) for count in self.effects.values()):
            raise ConfigurationError(
                f"scenario {self.name!r}: effects must map each never tool to a function "
                "returning how many times its effect happened"
            )
        if isinstance(self.modules, str):
            self.modules = [m.strip() for m in self.modules.split(",") if m.strip()]

    def expected_count(self, tool: str) -> int:
        return int(self.expected.get(tool, 1))

    def worker_env(self) -> dict[str, str]:
        env = self.env() if callable(self.env) else self.env
        return {str(k): str(v) for k, v in env.items()}

    def counts(self) -> dict[str, int]:
        return {tool: int(count()) for tool, count in self.effects.items()}

    def resolved_policy(self) -> Policy | None:
        if self.policy is None or callable(self.policy):
            return self.policy
        from .policies import POLICIES

        if self.policy in POLICIES:
            return POLICIES[self.policy]
        found = load_object(self.policy, "policy")
        problem = policy_problem(found)
        if problem is not None:
            raise ConfigurationError(f"scenario {self.name!r}: policy {self.policy!r}: {problem}")
        policy: Policy = found
        return policy


def load_object(spec: str, what: str = "object") -> Any:
    """``module:attribute`` imported (the current directory is importable, as with
    ``celery -A``); one-line ConfigurationError when it is not there."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"{what} {spec!r}: expected module:name, e.g. myapp.scenarios:refund"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ConfigurationError(
            f"{what} {spec!r}: cannot import {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    try:
        value = module
        for part in attribute.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise ConfigurationError(f"{what} {spec!r}: {module_name} has no {attribute!r}") from None
    return value


def load_scenario(spec: str | Scenario | Callable[[], Scenario]) -> Scenario:
    """A Scenario from ``module:name`` (a Scenario, or a function returning one)."""
    value = load_object(spec, "scenario") if isinstance(spec, str) else spec
    if not isinstance(value, Scenario) and callable(value):
        try:
            inspect.signature(value).bind()
        except TypeError:
            raise ConfigurationError(
                f"scenario {spec!r} is a function that needs arguments; a scenario function "
                "takes none and returns a durable_agent.testing.Scenario"
            ) from None
        except ValueError:
            pass  # no signature to read: call it and see
        value = value()
    if not isinstance(value, Scenario):
        raise ConfigurationError(
            f"scenario {spec!r} is a {type(value).__name__}, not a durable_agent.testing.Scenario"
        )
    return value
