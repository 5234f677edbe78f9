"""MCP tool calls: what the journal costs per call, beside the plain MCP client.

One test MCP server (``durable_agent.testing.mcp_server``, over stdio) answers every call.
Per repetition, ``calls`` calls of its read-only ``lookup_note`` are made four ways, one
batch after the other so that all four see the same moments of a noisy machine:

* **plain client**: the MCP SDK's ``Client`` alone, ``await client.call_tool(...)`` on an
  open session (no durability);
* **our tool, no journal**: the ``Tool`` that ``tools_from_server`` gives, called as a
  function: the sync bridge to the process's session (what every journaled call pays too);
* **journaled, safe**: each call a step of a claimed turn through the worker's
  ``StepRunner`` and ``ClaimedJournal`` (intent, call, outcome carried by the next step);
* **journaled, never**: the same with the tool labelled ``never`` (its intent waits for the
  WAL flush before the call).

The journal's cost per call is a journaled call's median less the bridge's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from typing import Any

from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import Claim, Database, JournalStore, Leases

from . import scratch_database, spread

SERVER = [sys.executable, "-m", "durable_agent.testing.mcp_server"]
OWNER = "bench:mcp:0"
WAYS = ("plain client", "our tool, no journal", "journaled, safe", "journaled, never")


class _Claimed:
    def check(self) -> None:
        pass

    def still_claimed(self) -> bool:
        return True


def run(*, calls: int = 200, reps: int = 5) -> dict[str, Any]:
    """Run the four ways in alternating batches; print and return µs per call."""
    from mcp import Client, StdioServerParameters

    from durable_agent.mcp import close_sessions, tools_from_server
    from durable_agent.step.runner import StepRunner
    from durable_agent.step.tools import ToolRegistry

    tools = {
        label: tools_from_server(
            f"bench-{label}", command=SERVER, replay={"lookup_note": label, "archive_note": "safe"}
        ).named("lookup_note")
        for label in ("safe", "never")
    }
    samples: dict[str, list[float]] = {way: [] for way in WAYS}
    with scratch_database() as url:
        db = Database(url)
        store, leases = JournalStore(db), Leases(db)

        def journaled(label: str) -> float:
            turn = store.create_turn(f"bench-{uuid.uuid4().hex[:12]}", "mcp benchmark")
            claim = leases.claim(turn.turn_id, OWNER, 600.0)
            if not isinstance(claim, Claim):
                raise RuntimeError(f"could not claim a fresh turn: {claim}")
            journal = store.for_claim(turn.turn_id, claim.epoch, empty=True)
            runner = StepRunner(
                journal, tools=ToolRegistry([tools[label]]), guard=_Claimed(), max_steps=calls
            )
            arguments = json.dumps({"name": "launch"})
            started = time.perf_counter()
            for n in range(calls):
                text = runner.tool_step(
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": "lookup_note", "arguments": arguments},
                    }
                )
                if not text.startswith("The launch"):
                    raise RuntimeError(f"unexpected result: {text[:80]}")
            journal.flush()
            spent = time.perf_counter() - started
            rows = store.load_journal(turn.turn_id)
            if len(rows) != calls or any(r.status != "done" for r in rows):
                raise RuntimeError("the journal does not hold every call as done")
            return spent * 1e6 / calls

        def bridge() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                tools["safe"](name="launch")
            return (time.perf_counter() - started) * 1e6 / calls

        async def measure() -> None:
            params = StdioServerParameters(command=SERVER[0], args=SERVER[1:])
            async with Client(params, cache=None) as client:

                async def plain() -> float:
                    started = time.perf_counter()
                    for _ in range(calls):
                        result = await client.call_tool("lookup_note", {"name": "launch"})
                        if result.is_error:
                            raise RuntimeError("the plain call failed")
                    return (time.perf_counter() - started) * 1e6 / calls

                for rep in range(reps + 1):  # the first round warms up, not counted
                    figures = {
                        "plain client": await plain(),
                        "our tool, no journal": bridge(),
                        "journaled, safe": journaled("safe"),
                        "journaled, never": journaled("never"),
                    }
                    if rep:
                        for way, value in figures.items():
                            samples[way].append(value)

        try:
            asyncio.run(measure())
        finally:
            close_sessions()
            db.close()

    medians = {way: statistics.median(values) for way, values in samples.items()}
    table = Table(title=f"MCP tool calls: µs per call ({reps} reps of {calls} calls, medians)")
    for column in ("way", "µs per call", "min-max", "x plain client"):
        table.add_column(column, justify="left" if column == "way" else "right", no_wrap=True)
    for way in WAYS:
        table.add_row(
            way,
            f"{medians[way]:.0f}",
            spread(samples[way]),
            f"{medians[way] / medians['plain client']:.2f}x",
        )
    out.print(table)
    journal_safe = medians["journaled, safe"] - medians["our tool, no journal"]
    journal_never = medians["journaled, never"] - medians["our tool, no journal"]
    out.print(
        f"  the journal's cost per call: {journal_safe:.0f} µs (safe), "
        f"{journal_never:.0f} µs (never: the intent waits for the WAL flush)"
    )
    return {
        "calls_per_rep": calls,
        "reps": reps,
        "us_per_call": {way: {"median": medians[way], "samples": samples[way]} for way in WAYS},
        "journal_us_per_call": {"safe": journal_safe, "never": journal_never},
    }
