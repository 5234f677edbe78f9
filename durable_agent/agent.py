"""The agent loop: model call, every tool call of the reply, model call, until a plain reply.

It has no I/O of its own: every call goes through the :class:`~durable_agent.runner.StepRunner`,
and the conversation is rebuilt only from the session's earlier turns and this turn's
journal, so a replay sends byte-for-byte the same requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .runner import StepRunner
from .tools import ToolRegistry

ModelCall = Callable[[dict[str, Any]], dict[str, Any]]


def initial_messages(
    system_prompt: str, history: list[tuple[str, str]], user_message: str
) -> list[dict[str, Any]]:
    """The conversation before this turn's first model call."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    for earlier_message, earlier_reply in history:
        messages.append({"role": "user", "content": earlier_message})
        messages.append({"role": "assistant", "content": earlier_reply})
    messages.append({"role": "user", "content": user_message})
    return messages


def run_agent(
    runner: StepRunner,
    *,
    model: str,
    tools: ToolRegistry,
    messages: list[dict[str, Any]],
    call_model: ModelCall,
) -> str:
    """Walk the loop until the model answers without tool calls; return that answer."""
    schemas = tools.openai_schemas()
    while True:
        request: dict[str, Any] = {"model": model, "messages": list(messages)}
        if schemas:
            request["tools"] = schemas
        response = runner.model_step(request, call_model)
        message = response["message"]
        messages.append(message)
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            return str(message.get("content") or "")
        for tool_call in tool_calls:
            content = runner.tool_step(tool_call)
            messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": content})
