"""An MCP tool result as the text the model reads, and the JSON Schema check of a call's
arguments against the schema the server listed.

The text: the result's text blocks joined by blank lines (an embedded text resource counts
as text); an image, audio or binary resource block is named, not inlined (the journal keeps
what the model reads, and Chat Completions tool results are text); when the result has no
text at all, its ``structuredContent`` as JSON. The MCP server SDKs put a structured result's
JSON in a text block too, so the model reads the same either way.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any, ClassVar

import pydantic

if TYPE_CHECKING:
    from mcp_types import CallToolResult


def result_text(result: CallToolResult) -> str:
    """What the model reads of an MCP tool result."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            uri = getattr(resource, "uri", "")
            parts.append(str(text) if text is not None else f"[binary resource {uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, not shown]")
        else:
            parts.append(f"[{kind} content, not shown]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True)
    return "\n\n".join(parts)


class _ListedArguments(pydantic.BaseModel):
    """Arguments checked against a JSON Schema the server listed, kept as they are."""

    model_config = pydantic.ConfigDict(extra="allow")
    listed_schema: ClassVar[dict[str, Any]] = {}
    validator: ClassVar[Any] = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        problems = sorted(cls.validator.iter_errors(data), key=lambda e: [str(p) for p in e.path])
        if problems:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}"
                    for e in problems
                )
            )
        return data

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(cls.listed_schema)


def arguments_model(model_name: str, schema: dict[str, Any]) -> type[pydantic.BaseModel]:
    """A pydantic model whose JSON schema is ``schema`` and whose validation checks a call's
    arguments against it (jsonschema), keeping them as they are; raises ValueError when the
    schema itself is not valid JSON Schema."""
    import jsonschema

    kept = copy.deepcopy(schema)
    validator_class = jsonschema.validators.validator_for(kept)
    try:
        validator_class.check_schema(kept)
    except jsonschema.SchemaError as error:
        raise ValueError(f"its input schema is not valid JSON Schema: {error.message}") from None
    model = type(
        model_name,
        (_ListedArguments,),
        {"listed_schema": kept, "validator": validator_class(kept), "__module__": __name__},
    )
    return model
