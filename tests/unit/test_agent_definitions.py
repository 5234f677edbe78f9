"""Agent definitions: checked when defined, resolved against the tools, compared by digest."""

from __future__ import annotations

import pytest

from durable_agent import Agent, ConfigurationError, InvalidArgument, Settings, tool
from durable_agent.step.agents import AgentBook, bind, changes
from durable_agent.step.chat import chat_completions
from durable_agent.step.tools import ToolRegistry


@tool(replay="safe", name="ut_agents_read")
def read(key: str) -> str:
    """Read.

    Args:
        key: The key.
    """
    return key


@tool(replay="never", name="ut_agents_write")
def write(key: str) -> str:
    """Write.

    Args:
        key: The key.
    """
    return key


REGISTRY = ToolRegistry([read, write])
SETTINGS = Settings(queue="q-default", model="m-default", max_steps=9)


def test_an_agent_falls_back_to_the_settings_and_picks_its_tools() -> None:
    """Unset fields come from the settings; tools given by name or object are a subset."""
    bound = bind(Agent("a", tools=["ut_agents_read"]), SETTINGS, REGISTRY, chat_completions)
    assert (bound.model, bound.queue, bound.max_steps) == ("m-default", "q-default", 9)
    assert bound.tools.names() == ["ut_agents_read"]
    assert bind(Agent("b"), SETTINGS, REGISTRY, chat_completions).tools.names() == [
        "ut_agents_read",
        "ut_agents_write",
    ]
    with pytest.raises(ConfigurationError, match="lists tool 'nope'"):
        bind(Agent("c", tools=["nope"]), SETTINGS, REGISTRY, chat_completions)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "has space"}, "agent name"),
        ({"name": "a", "max_steps": 0}, "max_steps"),
        ({"name": "a", "parameters": {"model": "x"}}, "may not set model"),
        ({"name": "a", "parameters": {"t": object()}}, "JSON values"),
        ({"name": "a", "tools": "ut_agents_read"}, "list of tools"),
        ({"name": "a", "queue": "bad queue"}, "not a queue name"),
    ],
)
def test_a_wrong_definition_fails_when_defined(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Agent(**fields)  # type: ignore[arg-type]


def test_changes_say_what_differs() -> None:
    """Model, instructions, parameters, labels, schemas, tools added and removed."""
    old = bind(Agent("a", parameters={"temperature": 0}), SETTINGS, REGISTRY, chat_completions)
    relabelled = REGISTRY.relabelled({"ut_agents_read": "never"})
    new = bind(
        Agent("a", model="m2", instructions="new", tools=["ut_agents_read"]),
        SETTINGS,
        relabelled,
        chat_completions,
    )
    assert old.digest != new.digest
    assert changes(old.spec(), old.spec()) == []
    assert changes(old.spec(), new.spec()) == [
        "model m-default -> m2",
        "instructions changed",
        'parameters {"temperature": 0} -> {}',
        "tool ut_agents_read relabelled safe -> never",
        "tool ut_agents_write removed",
    ]


def test_a_worker_serves_every_agent_of_its_queues() -> None:
    """Serving one agent means consuming its queue, and so every agent on that queue."""
    agents = [
        bind(Agent(name, queue=queue), SETTINGS, REGISTRY, chat_completions)
        for name, queue in (("a", "q1"), ("b", "q1"), ("c", "q2"))
    ]
    book = AgentBook(agents, serve=["a"])
    assert book.queues == ["q1"] and book.served == {"a", "b"}
    assert AgentBook(agents).queues == ["q1", "q2"]
    with pytest.raises(ConfigurationError, match="no agent named 'z'"):
        AgentBook(agents, serve=["z"])
    with pytest.raises(InvalidArgument, match="no agent named 'z'"):
        AgentBook(agents)["z"]


def test_an_agent_on_the_responses_api_runs_its_loop_and_says_so_in_its_digest() -> None:
    from durable_agent.step.responses import responses_loop

    registry = ToolRegistry([read])
    settings = Settings(stream=False)
    chat = bind(Agent("chatty"), settings, registry, chat_completions)
    responses = bind(Agent("reasoner", api="responses"), settings, registry, chat_completions)
    assert (chat.loop, chat.api, chat.stream) == (chat_completions, "chat", False)
    assert (responses.loop, responses.api) == (responses_loop, "responses")
    assert "api" not in chat.spec()  # a Chat Completions agent's digest is as before
    assert responses.spec()["api"] == "responses"
    assert "loop" in " ".join(changes(chat.spec(), responses.spec()))
    assert bind(Agent("s", stream=True), settings, registry, chat_completions).stream is True


def test_an_agent_derives_the_concurrency_key_of_a_turn_from_its_session() -> None:
    agent = bind(
        Agent("tenanted", concurrency_key=lambda session: session.split(":")[0]),
        Settings(),
        ToolRegistry([read]),
        chat_completions,
    )
    assert agent.key_for("acme:42") == "acme"
    odd = bind(
        Agent("odd", concurrency_key=lambda s: 7), Settings(), ToolRegistry(), chat_completions
    )  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="not text"):
        odd.key_for("x")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"api": "completions"}, "api must be 'chat' or 'responses'"),
        ({"stream": "yes"}, "stream must be True or False"),
        ({"concurrency_key": "tenant"}, "concurrency_key must be a function"),
    ],
)
def test_a_wrong_api_stream_or_key_fails_when_defined(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Agent("bad", **fields)  # type: ignore[arg-type]
