"""Agents that wait and delegate (``DURABLE_AGENT_AGENTS=durable_agent_examples.waiting_agents``,
with ``DURABLE_AGENT_TOOLS=durable_agent_examples.email_tools``).

* ``reminder``: the built-in loop with the ``wait_seconds`` tool: the model decides to wait
  ("remind them in 10 minutes"), the turn sleeps parked, then it emails the reminder.
* ``checkout``: a loop of its own that waits for the event ``payment_settled`` (at most
  an hour, or ``CHECKOUT_SETTLE_SECONDS``) and emails the receipt, or says the payment
  never came.
* ``support`` delegates to ``research`` (an agent given as a tool): the model calls
  ``research(message)``, a child turn of the research agent answers, and support replies.
* ``courier``: the crash matrix's scenario (``waiting_agents_scenario.py``): it asks the research
  agent (a child turn), sleeps a moment, has the event ``go`` sent (``ring``, a tool that
  sends it through the broker) and waits for it, then emails the answer.

Their scripted model is ``waiting_agents_policy.py``.
"""

from __future__ import annotations

import os

from durable_agent import (
    Agent,
    TurnContext,
    current_call,
    send_event,
    tool,
    wait_seconds,
)

from .email_tools import lookup_note, send_email

research = Agent(
    "research",
    instructions="You research a question with the notes you can look up; answer briefly.",
    tools=[lookup_note],
    queue=os.environ.get("RESEARCH_QUEUE") or None,  # its own queue and workers, if set
)

support = Agent(
    "support",
    instructions="You answer customers. Ask the research agent when you need facts.",
    tools=[research],
)

reminder = Agent(
    "reminder",
    instructions="You send reminders by email at the time the user asks for.",
    tools=[wait_seconds, send_email],
)


def settle_then_email(ctx: TurnContext) -> str:
    """Wait for the payment to settle (an event), then email the receipt."""
    timeout = float(ctx.parameters.get("settle_timeout", 3600))
    settled = ctx.wait_for_event("payment_settled", timeout=timeout)
    if settled.timed_out:
        return f"The payment did not settle within {timeout:g} seconds; no receipt was sent."
    payment = settled.payload if isinstance(settled.payload, dict) else {}
    to = str(payment.get("email") or "ada@example.com")
    ctx.tool("send_email", {"to": to, "subject": "Receipt", "body": f"Paid: {payment}"})
    return f"Payment {payment.get('payment_id', '?')} settled; the receipt went to {to}."


checkout = Agent(
    "checkout",
    loop=settle_then_email,
    tools=[send_email],
    events=["payment_settled"],  # send_event refuses any other name for its turns
    # CHECKOUT_SETTLE_SECONDS: how long it waits (an hour; the tests make it short)
    parameters={"settle_timeout": float(os.environ.get("CHECKOUT_SETTLE_SECONDS", "3600"))},
)


@tool(replay="safe")
def ring(name: str) -> str:
    """Have the event ``name`` sent to this turn, through the broker (a worker records it).

    Args:
        name: The event's name.
    """
    call = current_call()
    assert call is not None
    event_id = f"ring-{call.turn_id}-{call.step}"  # the same for a call run again
    send_event.delay(call.turn_id, name, {"rung_at_step": call.step}, event_id=event_id)
    return f"asked for {name}"


def courier_loop(ctx: TurnContext) -> str:
    """Ask research (a child turn), sleep a moment, have ``go`` sent and wait for it (it
    may come before the wait or while the turn is parked), email the answer."""
    answer = ctx.run_agent(research, f"What does the note launch say? ({ctx.message})")
    ctx.sleep(float(ctx.parameters.get("pause", 0.5)))
    ctx.tool("ring", {"name": "go"})
    ctx.wait_for_event("go", timeout=float(ctx.parameters.get("go_timeout", 30)))
    ctx.tool("send_email", {"to": "ada@example.com", "subject": "Note: launch", "body": answer})
    return "Sent the research answer."


courier = Agent(
    "courier",
    loop=courier_loop,
    tools=[send_email, ring],
    parameters={"pause": 0.5, "go_timeout": 30},
)
