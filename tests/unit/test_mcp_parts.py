"""The parts of durable_agent.mcp that need no server: the worker imports no MCP unless a
tool uses it; where a server is (checked); an MCP result as the text the model reads; the
schema the model sees, the idempotency key taken out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from durable_agent.errors import ConfigurationError

pytest.importorskip("mcp")

from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from durable_agent.mcp.results import arguments_model, result_text
from durable_agent.mcp.server_tools import _model_schema
from durable_agent.mcp.servers import server_spec


def test_the_worker_imports_no_mcp_unless_a_tool_uses_it() -> None:
    """durable_agent, its Celery module and a runtime with its agents and tools built load
    nothing of the MCP SDK (an optional extra)."""
    code = (
        "import sys, durable_agent, durable_agent.tasks\n"
        "from durable_agent.runtime import Runtime\n"
        "from durable_agent.settings import Settings\n"
        "runtime = Runtime(Settings(tools='durable_agent_examples.email_tools,"
        "durable_agent_examples.plan_act'))\n"
        "assert runtime.agents.names()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')\n"
        "             or m.startswith('durable_agent.mcp')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _spec(**where: object) -> object:
    options: dict[str, object] = {
        "command": None,
        "url": None,
        "env": None,
        "cwd": None,
        "headers": None,
        "connect_timeout": 30.0,
        "call_timeout": 300.0,
    }
    return server_spec("notes", **{**options, **where})  # type: ignore[arg-type]


def test_a_command_is_a_list_or_a_shell_split_string() -> None:
    spec = _spec(command="python -m 'my server' --stdio")
    assert spec.command == ("python", "-m", "my server", "--stdio")  # type: ignore[attr-defined]
    assert "command: python -m 'my server' --stdio" in spec.where  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ({}, "exactly one of command"),
        ({"command": ["x"], "url": "http://h/mcp"}, "exactly one of command"),
        ({"command": ""}, "command is empty"),
        ({"command": "a 'b"}, "No closing quotation"),
        ({"url": "ftp://h/mcp"}, "not an http(s) URL"),
        ({"url": "http://h/mcp", "env": {"A": "1"}}, "env= and cwd= are for command="),
        ({"command": ["x"], "headers": {"A": "1"}}, "headers= is for url="),
        ({"command": ["x"], "env": {"A": 1}}, "env must map names to strings"),
        ({"command": ["x"], "call_timeout": 0}, "call_timeout must be a positive"),
    ],
)
def test_a_mistake_is_one_line_naming_the_server(where: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        _spec(**where)
    assert says in str(refused.value) and "MCP server 'notes'" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_model_reads_the_text_blocks_and_names_the_rest() -> None:
    result = CallToolResult(
        content=[
            TextContent(type="text", text="first"),
            ImageContent(type="image", data="aGk=", mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="file:///n.txt", text="embedded"),
            ),
        ]
    )
    assert result_text(result) == "first\n\n[image image/png, not shown]\n\nembedded"


def test_structured_content_alone_is_read_as_json() -> None:
    result = CallToolResult(content=[], structured_content={"b": 1, "a": "x"})
    assert result_text(result) == '{"a": "x", "b": 1}'


def test_the_idempotency_key_is_taken_out_of_the_models_schema() -> None:
    listed = {
        "type": "object",
        "properties": {"to": {"type": "string"}, "idempotency_key": {"type": "string"}},
        "required": ["to", "idempotency_key"],
        "additionalProperties": False,
    }
    schema, wants_key = _model_schema(listed)
    assert wants_key and schema["properties"] == {"to": {"type": "string"}}
    assert schema["required"] == ["to"]
    assert listed["required"] == ["to", "idempotency_key"]  # the listing is not changed
    assert _model_schema({"type": "object"}) == ({"type": "object", "properties": {}}, False)


def test_arguments_are_checked_against_the_listed_schema_and_kept_as_they_are() -> None:
    import pydantic

    model = arguments_model("ToArguments", {"type": "object", "required": ["to"]})
    assert model.model_validate({"to": "a", "n": [1]}).model_dump(mode="json") == {
        "to": "a",
        "n": [1],
    }
    with pytest.raises(pydantic.ValidationError, match="'to' is a required property"):
        model.model_validate({})
    with pytest.raises(ValueError, match="not valid JSON Schema"):
        arguments_model("Bad", {"type": "no-such-type"})


def test_labels_read_the_sdks_annotation_objects_and_wire_mappings() -> None:
    """mcp 2's ToolAnnotations name the hints in snake_case; the wire names are camelCase:
    either settles a label."""
    from mcp_types import ToolAnnotations

    from durable_agent.integrations.labels import label_from_annotations

    assert label_from_annotations(ToolAnnotations(read_only_hint=True)) == "safe"
    assert label_from_annotations(ToolAnnotations(destructive_hint=True)) == "never"
    both = ToolAnnotations(destructive_hint=True, idempotent_hint=True)
    assert label_from_annotations(both) is None
    assert label_from_annotations({"readOnlyHint": True}) == "safe"
    assert label_from_annotations({"destructiveHint": True, "idempotentHint": False}) == "never"
    assert label_from_annotations(ToolAnnotations()) is None
