"""The built-in loop: model call, every tool call of the reply, model call, until a plain reply.

It is written on the public loop API (:class:`~durable_agent.step.loop.TurnContext`), as a
loop of yours would be: it has no I/O of its own, every call is a ``ctx.model()`` or a
``ctx.tool_call()``, and the conversation is rebuilt only from the session's earlier turns
and this turn's journal, so a replay sends byte-for-byte the same requests.
"""

from __future__ import annotations

from typing import Any

from .loop import ModelCall, TurnContext, TurnInput, initial_messages
from .runner import StepRunner
from .tools import ToolRegistry

__all__ = ["chat_completions", "initial_messages", "run_agent"]


def chat_completions(ctx: TurnContext) -> str:
    """Walk the loop until the model answers without tool calls; return that answer."""
    return _converse(ctx, ctx.messages())


def _converse(ctx: TurnContext, messages: list[dict[str, Any]]) -> str:
    while True:
        response = ctx.model({"messages": list(messages)}, stream=ctx.streaming)
        message = response["message"]
        messages.append(message)
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            return str(message.get("content") or "")
        for tool_call in tool_calls:
            content = ctx.tool_call(tool_call)
            messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": content})


def run_agent(
    runner: StepRunner,
    *,
    model: str,
    tools: ToolRegistry,
    messages: list[dict[str, Any]],
    call_model: ModelCall,
) -> str:
    """The built-in loop from a given conversation (for tests of the loop over a runner)."""
    ctx = TurnContext(
        runner,
        call_model=call_model,
        turn=TurnInput(runner.turn_id, "", ""),
        model=model,
        instructions="",
        tools=tools,
    )
    return _converse(ctx, messages)
