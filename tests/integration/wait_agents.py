"""Agents of the wait tests: loops that sleep, wait for events and run child agents, with
no model call (so no model server is needed)."""

from __future__ import annotations

from durable_agent import Agent, ChildTurnFailed, TurnContext, TurnFailed


def sleeper_loop(ctx: TurnContext) -> str:
    ctx.sleep(float(ctx.parameters.get("seconds", 30)))
    return "awake"


def waiter_loop(ctx: TurnContext) -> str:
    got = ctx.wait_for_event("go", timeout=float(ctx.parameters.get("timeout", 30)))
    if got.timed_out:
        return "timed out"
    return f"got {got.payload} ({got.event_id})"


def twice_loop(ctx: TurnContext) -> str:
    first = ctx.wait_for_event("go")
    second = ctx.wait_for_event("go")
    return f"{first.payload} then {second.payload}"


def echo_loop(ctx: TurnContext) -> str:
    ctx.sleep(0)  # a step (due at once: it does not park)
    if ctx.message.startswith("fail"):
        raise TurnFailed("echo was told to fail")
    return f"echo: {ctx.message}"


def delegator_loop(ctx: TurnContext) -> str:
    try:
        return "child said " + ctx.run_agent("echo", ctx.message)
    except ChildTurnFailed as error:
        return f"child failed: {error}"


def nester_loop(ctx: TurnContext) -> str:
    depth = int(ctx.message)
    if depth <= 0:
        return "bottom"
    try:
        return f"{depth}/" + ctx.run_agent("nester", str(depth - 1))
    except ChildTurnFailed as error:
        return f"stopped at {depth}: {error}"


sleeper = Agent("sleeper", loop=sleeper_loop, tools=[], parameters={"seconds": 30})
waiter = Agent("waiter", loop=waiter_loop, tools=[], parameters={"timeout": 30}, events=["go"])
strict = Agent("strict", loop=waiter_loop, tools=[], events=["stop"])  # waits for "go" anyway
twice = Agent("twice", loop=twice_loop, tools=[])
echo = Agent("echo", loop=echo_loop, tools=[], queue="wait-tests-far")  # another queue
delegator = Agent("delegator", loop=delegator_loop, tools=[])
nester = Agent("nester", loop=nester_loop, tools=[])
