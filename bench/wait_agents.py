"""The agents of the waits benchmark (no model calls: what is measured is the park
mechanism): ``sleeper`` sleeps ``BENCH_SLEEP_SECONDS``, ``waiter`` waits for the event
``go``, ``delegator`` asks ``echo`` (a child turn), ``quick`` is a turn that only answers."""

from __future__ import annotations

import os

from durable_agent import Agent, TurnContext


def sleeper_loop(ctx: TurnContext) -> str:
    ctx.sleep(float(os.environ.get("BENCH_SLEEP_SECONDS", "30")))
    return "awake"


def waiter_loop(ctx: TurnContext) -> str:
    ctx.wait_for_event("go")
    return "went"


def echo_loop(ctx: TurnContext) -> str:
    return f"echo: {ctx.message}"


def delegator_loop(ctx: TurnContext) -> str:
    return ctx.run_agent("echo", ctx.message)


def quick_loop(ctx: TurnContext) -> str:
    return "ok"


sleeper = Agent("sleeper", loop=sleeper_loop, tools=[])
waiter = Agent("waiter", loop=waiter_loop, tools=[])
echo = Agent("echo", loop=echo_loop, tools=[])
delegator = Agent("delegator", loop=delegator_loop, tools=[])
quick = Agent("quick", loop=quick_loop, tools=[])
