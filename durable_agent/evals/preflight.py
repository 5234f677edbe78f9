"""What a crash matrix checks before it starts anything: a mistake in the command or the
scenario is one line, not a traceback after a minute of crashes.

Against the scenario's agent, as its modules define it (imported here, as the workers will):
every ``--relabel`` and every ``--point`` tool names one of its tools; a ``--point`` step is
below its step cap; the scenario's ``effects`` name exactly its ``never`` tools (as labelled
in the code, before any relabel), so a typo cannot run a matrix in which every point fails
and a ``never`` tool cannot go uncounted. Step numbers that the clean run does not reach are
refused right after it (:func:`check_points_reached`), before the first crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..errors import ConfigurationError
from ..journal import Step
from ..runtime import Runtime
from ..settings import Settings
from ..step.agents import DEFAULT_AGENT, BoundAgent
from ..testing.scenario import Scenario

MODEL_STEP = "llm"


def scenario_agent(settings: Settings, scenario: Scenario) -> BoundAgent:
    """The scenario's agent as its modules define it (one-line error if they cannot load)."""
    runtime = Runtime(settings.model_copy(update={"tools": ",".join(scenario.modules)}))
    try:
        return runtime.agents[scenario.agent or DEFAULT_AGENT]
    except ConfigurationError:
        raise
    except Exception as error:  # InvalidArgument: no such agent
        raise ConfigurationError(f"scenario {scenario.name!r}: {error}") from None
    finally:
        runtime.close()


def check_before_running(
    settings: Settings,
    scenario: Scenario,
    *,
    relabel: Mapping[str, str],
    only: Sequence[tuple[int | str, str]] | None,
) -> BoundAgent:
    """Refuse, with one line, what would make the matrix fail or mean nothing."""
    agent = scenario_agent(settings, scenario)
    names = agent.tools.names()
    known = ", ".join(names) or "none"
    for tool in relabel:
        if tool not in names:
            raise ConfigurationError(
                f"--relabel {tool}={relabel[tool]}: agent {agent.name!r} has no tool {tool!r} "
                f"(its tools: {known})"
            )
    for target, point in only or ():
        if isinstance(target, int):
            if not 0 <= target < agent.max_steps:
                raise ConfigurationError(
                    f"--point {target}:{point}: agent {agent.name!r} stops at "
                    f"{agent.max_steps} steps (0-{agent.max_steps - 1})"
                )
        elif target != MODEL_STEP and target not in names and not _is_wait(target):
            raise ConfigurationError(
                f"--point {target}:{point}: agent {agent.name!r} has no tool {target!r} "
                f"(its tools: {known}; or a step number, {MODEL_STEP} for its model calls, "
                "or a wait: sleep, event:NAME, agent:NAME)"
            )
    never = [t.name for t in agent.tools if t.replay == "never"]
    counted = list(scenario.effects)
    unknown = [name for name in counted if name not in never]
    if unknown:
        raise ConfigurationError(
            f"scenario {scenario.name!r}: effects names {', '.join(map(repr, unknown))}, "
            f"not a never tool of agent {agent.name!r} (its never tools: "
            f"{', '.join(never) or 'none'})"
        )
    uncounted = [name for name in never if name not in counted]
    if uncounted:
        raise ConfigurationError(
            f"scenario {scenario.name!r}: never tool(s) {', '.join(map(repr, uncounted))} of "
            f"agent {agent.name!r} have no effect counter in effects: the matrix could not "
            "tell whether a crash made one run twice"
        )
    return agent


def check_points_reached(
    steps: Iterable[Step], only: Sequence[tuple[int | str, str]] | None
) -> None:
    """After the clean run: every ``--point`` names a step or call the clean turn made."""
    recorded = list(steps)
    for target, point in only or ():
        if not any(target in (s.step, s.name) for s in recorded):
            calls = ", ".join(f"{s.step} {s.name}" for s in recorded)
            raise ConfigurationError(
                f"--point {target}:{point}: the clean turn has no such step (its steps: {calls})"
            )


def _is_wait(target: str) -> bool:
    """A wait step's name (``ctx.sleep``, ``ctx.wait_for_event``, ``ctx.run_agent``)."""
    return target == "sleep" or target.startswith(("agent:", "event:"))
