"""Unit tests of the tool registry: replay labels, name clashes, schemas, loading modules."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from durable_agent import ConfigurationError, Tool, ToolDefinitionError, tool
from durable_agent.step.tools import ToolRegistry, load_tools, parse_docstring

# Tool names are process-wide, so every tool defined here has a name starting with "ut_tools_".


@tool(replay="never", name="ut_tools_refund")
def refund(
    order_id: str, amount_cents: int, reason: str = "customer request", *, idempotency_key: str
) -> str:
    """Refund an order.

    Money goes back to the card it was paid with.

    Args:
        order_id: The order to refund.
        amount_cents (int): How much, in cents.
            Must be positive.
        reason: Why the customer gets the money back.

    Returns:
        A confirmation line.
    """
    return f"refunded {amount_cents} on {order_id} ({reason}) key={idempotency_key}"


@tool(replay="safe", name="ut_tools_lookup")
def lookup(name: str) -> str:
    """Look something up."""
    return name.upper()


@pytest.fixture
def tools_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for throwaway tools modules; they are unloaded afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("ut_tools_mod_"):
            del sys.modules[name]


# -- labels ------------------------------------------------------------------------------------


def test_safe_and_never_labels_are_recorded() -> None:
    """@tool(replay=...) builds a Tool carrying its label, and it stays callable as a function."""
    assert isinstance(refund, Tool) and isinstance(lookup, Tool)
    assert refund.replay == "never"
    assert lookup.replay == "safe"
    assert lookup("x") == "X"
    assert lookup.module == __name__


def test_bare_decorator_without_label_is_rejected() -> None:
    """`@tool` with no parentheses fails at definition, naming the function and both labels."""
    with pytest.raises(ToolDefinitionError) as caught:

        @tool
        def ut_tools_bare(x: int) -> int:
            return x

    message = str(caught.value)
    assert "ut_tools_bare" in message
    assert "replay='safe'" in message and "replay='never'" in message


def test_empty_call_without_label_is_rejected() -> None:
    """`@tool()` has no default label: it fails and says there is no default."""
    with pytest.raises(ToolDefinitionError) as caught:

        @tool()
        def ut_tools_empty(x: int) -> int:
            return x

    assert "ut_tools_empty" in str(caught.value)
    assert "no default" in str(caught.value)


def test_misspelled_label_is_rejected() -> None:
    """replay='nevr' fails, quoting the wrong value and the two right ones."""
    with pytest.raises(ToolDefinitionError) as caught:

        @tool(replay="nevr")  # type: ignore[arg-type]
        def ut_tools_typo(x: int) -> int:
            return x

    message = str(caught.value)
    assert "'nevr'" in message
    assert "'safe'" in message and "'never'" in message


def test_misspelled_keyword_is_rejected() -> None:
    """reply='safe' (instead of replay=) fails, naming the unknown keyword."""
    with pytest.raises(ToolDefinitionError) as caught:

        @tool(reply="safe")
        def ut_tools_kwtypo(x: int) -> int:
            return x

    assert "reply" in str(caught.value)
    assert "replay=" in str(caught.value)


def test_two_functions_with_one_name_are_rejected() -> None:
    """A second, different function taking a used tool name fails and names both origins."""

    @tool(replay="safe", name="ut_tools_dup")
    def first(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError) as caught:

        @tool(replay="never", name="ut_tools_dup")
        def second(x: int) -> int:
            return x

    message = str(caught.value)
    assert "'ut_tools_dup'" in message
    assert f"{__name__}.{first.function.__qualname__}" in message
    assert "second" in message
    assert "name=" in message


def test_redecorating_the_same_function_is_fine() -> None:
    """The same function (same module and qualname) registered twice is not a clash."""

    def ut_tools_again(x: int) -> int:
        """Echo."""
        return x

    one = tool(replay="safe")(ut_tools_again)
    two = tool(replay="safe")(ut_tools_again)
    assert one.name == two.name == "ut_tools_again"


def test_tool_name_must_follow_openai_rules() -> None:
    """A name with characters OpenAI refuses is rejected at definition."""
    with pytest.raises(ToolDefinitionError, match="1-64"):

        @tool(replay="safe", name="has space")
        def spaced(x: int) -> int:
            return x


# -- signatures and schemas --------------------------------------------------------------------


def test_schema_from_hints_and_docstring() -> None:
    """Types come from the hints, descriptions from `Args:`, required/defaults are right."""
    function = refund.openai_schema()["function"]
    assert function["name"] == "ut_tools_refund"
    assert function["description"] == (
        "Refund an order.\n\nMoney goes back to the card it was paid with."
    )
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert parameters["additionalProperties"] is False
    properties = parameters["properties"]
    assert list(properties) == ["order_id", "amount_cents", "reason"]
    assert properties["order_id"] == {"type": "string", "description": "The order to refund."}
    assert properties["amount_cents"] == {
        "type": "integer",
        "description": "How much, in cents. Must be positive.",
    }
    assert properties["reason"] == {
        "type": "string",
        "description": "Why the customer gets the money back.",
        "default": "customer request",
    }
    assert parameters["required"] == ["order_id", "amount_cents"]


def test_idempotency_key_is_hidden_and_passed_at_invoke() -> None:
    """The keyword-only idempotency_key is not in the schema; invoke fills it in."""
    assert refund.wants_idempotency_key is True
    assert "idempotency_key" not in refund.parameters_schema["properties"]
    assert "idempotency_key" not in refund.parameters_schema["required"]
    assert lookup.wants_idempotency_key is False

    result = refund.invoke({"order_id": "o-1", "amount_cents": 250}, "key-123")
    assert result == "refunded 250 on o-1 (customer request) key=key-123"
    # a tool without the parameter is called without it
    assert lookup.invoke({"name": "abc"}, "ignored") == "ABC"


def test_model_cannot_supply_the_idempotency_key() -> None:
    """Arguments naming idempotency_key fail validation (unknown fields are forbidden)."""
    with pytest.raises(pydantic.ValidationError):
        refund.validate({"order_id": "o-1", "amount_cents": 1, "idempotency_key": "mine"})
    assert refund.validate({"order_id": "o-1", "amount_cents": 1}) == {
        "order_id": "o-1",
        "amount_cents": 1,
        "reason": "customer request",
    }


def test_positional_idempotency_key_is_rejected() -> None:
    """idempotency_key must be keyword-only; a positional one fails with the fix in the text."""
    with pytest.raises(ToolDefinitionError, match="keyword-only"):

        @tool(replay="never")
        def ut_tools_positional_key(order_id: str, idempotency_key: str) -> str:
            return order_id


def test_missing_type_hint_is_rejected() -> None:
    """A parameter without a type hint fails, naming the tool and the parameter."""
    with pytest.raises(ToolDefinitionError) as caught:

        @tool(replay="safe")
        def ut_tools_no_hint(name, count: int) -> str:
            return str(name)

    assert "'ut_tools_no_hint'" in str(caught.value)
    assert "'name'" in str(caught.value)
    assert "type hint" in str(caught.value)


def test_var_args_are_rejected() -> None:
    """*args / **kwargs cannot be described to the model, so they are refused."""
    with pytest.raises(ToolDefinitionError, match="kwargs"):

        @tool(replay="safe")
        def ut_tools_varargs(**options: int) -> int:
            return len(options)


def test_async_tool_is_awaited_by_invoke() -> None:
    """An async tool's coroutine is run to completion by invoke."""

    @tool(replay="safe", name="ut_tools_async")
    async def slow_echo(text: str) -> str:
        """Echo after yielding once."""
        await asyncio.sleep(0)
        return text * 2

    assert slow_echo.invoke({"text": "ab"}, None) == "abab"


def test_parse_docstring_sections() -> None:
    """Returns/Raises sections are not mistaken for arguments or description."""
    summary, args = parse_docstring(
        textwrap.dedent(
            """\
            Do it.

            Args:
                a: First.
                b: Second,
                    continued.

            Raises:
                ValueError: never.
            """
        )
    )
    assert summary == "Do it."
    assert args == {"a": "First.", "b": "Second, continued."}


# -- loading and registries --------------------------------------------------------------------


def test_load_example_email_tools() -> None:
    """load_tools('durable_agent_examples.email_tools') finds its three tools with their labels."""
    registry = load_tools(["durable_agent_examples.email_tools"])
    assert registry.names() == ["list_sent_emails", "lookup_note", "send_email"]
    labels = {t.name: t.replay for t in registry}
    assert labels == {"list_sent_emails": "safe", "lookup_note": "safe", "send_email": "never"}
    send_email = registry.get("send_email")
    assert send_email is not None and send_email.wants_idempotency_key
    schema = send_email.parameters_schema
    assert sorted(schema["properties"]) == ["body", "subject", "to"]
    assert len(registry.openai_schemas()) == 3


def test_load_missing_module_names_it() -> None:
    """A tools module that does not exist is a ConfigurationError naming the module."""
    with pytest.raises(ConfigurationError) as caught:
        load_tools(["workers.no_such_tools_module"])
    assert "workers.no_such_tools_module" in str(caught.value)
    assert not isinstance(caught.value, ToolDefinitionError)


def test_load_module_that_fails_on_import(tools_module: Path) -> None:
    """A module that raises while importing is a ConfigurationError with the cause."""
    (tools_module / "ut_tools_mod_broken.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ConfigurationError) as caught:
        load_tools(["ut_tools_mod_broken"])
    assert "ut_tools_mod_broken" in str(caught.value)
    assert "boom at import" in str(caught.value)


def test_load_module_with_unlabelled_tool(tools_module: Path) -> None:
    """A module whose @tool lacks a label surfaces the ToolDefinitionError itself."""
    (tools_module / "ut_tools_mod_unlabelled.py").write_text(
        textwrap.dedent(
            """\
            from durable_agent import tool

            @tool
            def ut_tools_mod_fn(x: int) -> int:
                return x
            """
        )
    )
    with pytest.raises(ToolDefinitionError, match="needs a replay label"):
        load_tools(["ut_tools_mod_unlabelled"])


def test_relabelled_copies_with_new_labels() -> None:
    """relabelled() changes only the named tools, in a copy; the original keeps its labels."""
    registry = load_tools(["durable_agent_examples.email_tools"])
    wrong = registry.relabelled({"send_email": "safe"})
    assert {t.name: t.replay for t in wrong} == {
        "list_sent_emails": "safe",
        "lookup_note": "safe",
        "send_email": "safe",
    }
    original = registry.get("send_email")
    assert original is not None and original.replay == "never"
    changed = wrong.get("send_email")
    assert changed is not None and changed.function is original.function


def test_relabelled_unknown_tool_is_rejected() -> None:
    """Relabelling a tool the registry does not have names it in a ConfigurationError."""
    registry = ToolRegistry([lookup])
    with pytest.raises(ConfigurationError, match="ut_tools_nope"):
        registry.relabelled({"ut_tools_nope": "never"})


def test_registry_rejects_two_tools_with_one_name() -> None:
    """A registry refuses a second, different Tool object under a taken name."""
    registry = ToolRegistry([lookup])
    registry.add(lookup)  # the same object again is fine
    other = dataclasses.replace(lookup, replay="never")
    with pytest.raises(ToolDefinitionError, match="ut_tools_lookup"):
        registry.add(other)
    assert len(registry) == 1
