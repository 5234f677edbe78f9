"""An example loop that is not ours in shape: plan, act, re-plan, report.

The model never sees tool schemas or tool-call messages here. It is asked for a *plan*, a
JSON list of ``{"tool": NAME, "arguments": {...}}`` (an argument ``"$N"`` stands for the
result of call N of the same plan); the loop runs the plan's calls one by one through
``ctx.tool()``, shows the model the results and asks for the rest of the plan (``[]`` when
nothing is left), then asks for the reply. Every model call and tool call goes through the
turn's context, so the loop gets the journal's guarantees: a finished call is read back, an
interrupted ``never`` tool (``send_email``) is answered "may or may not have happened" and
the next plan can check ``list_sent_emails`` before it sends again.

Point a worker at it with ``DURABLE_AGENT_AGENTS=durable_agent_examples.plan_act`` (and
``DURABLE_AGENT_TOOLS=durable_agent_examples.email_tools``) and start turns with
``start_turn(session, message, agent="planner")``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from durable_agent import Agent, TurnContext

from .email_tools import list_sent_emails, lookup_note, send_email

PLANNER = (
    "Plan the tool calls that do what the user asks. Answer with only a JSON list of "
    '{"tool": NAME, "arguments": {...}}; an argument "$N" stands for the result of call N '
    "of the same plan (from 0). Answer [] when nothing is left to do."
)
RESULTS = "Results:"
REPORT = "Write the reply to the user."
MAX_ROUNDS = 4
_REFERENCE = re.compile(r"^\$(\d+)$")


def plan_then_act(ctx: TurnContext) -> str:
    """Plan, run the plan, show the results and plan again until the plan is empty; then
    ask for the reply."""
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": f"{ctx.instructions}\n\n{PLANNER}".strip()}
    ]
    for earlier_message, earlier_reply in ctx.history:
        conversation += [
            {"role": "user", "content": earlier_message},
            {"role": "assistant", "content": earlier_reply},
        ]
    conversation.append({"role": "user", "content": ctx.message})
    for _ in range(MAX_ROUNDS):
        text = _content(ctx.model({"messages": list(conversation), "tools": []}))
        conversation.append({"role": "assistant", "content": text})
        plan = parse_plan(text)
        if not plan:
            break
        results: list[str] = []
        for item in plan:
            arguments = {k: _resolve(v, results) for k, v in item["arguments"].items()}
            results.append(ctx.tool(item["tool"], arguments))
        shown = [
            {"tool": item["tool"], "result": result}
            for item, result in zip(plan, results, strict=True)
        ]
        conversation.append(
            {"role": "user", "content": f"{RESULTS}\n{json.dumps(shown, ensure_ascii=False)}"}
        )
    conversation.append({"role": "user", "content": REPORT})
    return _content(ctx.model({"messages": conversation, "tools": []}))


def parse_plan(text: str) -> list[dict[str, Any]]:
    """The calls of a plan; an answer that is not a plan counts as an empty one."""
    try:
        plan = json.loads(text)
    except ValueError:
        return []
    if not isinstance(plan, list):
        return []
    return [
        {"tool": str(item["tool"]), "arguments": dict(item.get("arguments") or {})}
        for item in plan
        if isinstance(item, dict) and isinstance(item.get("tool"), str)
    ]


def _resolve(value: Any, results: list[str]) -> Any:
    match = _REFERENCE.match(value) if isinstance(value, str) else None
    if match and int(match.group(1)) < len(results):
        return results[int(match.group(1))]
    return value


def _content(response: dict[str, Any]) -> str:
    return str(response["message"].get("content") or "")


planner = Agent(
    "planner",
    tools=[lookup_note, send_email, list_sent_emails],
    loop=plan_then_act,
    parameters={"temperature": 0},
)
