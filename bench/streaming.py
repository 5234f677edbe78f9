"""Streaming: how soon a watcher has each piece of the model's text, and what streaming costs
a turn.

The scripted model server (in this process) streams the final answer of each turn; the turn
runs on a turn worker in a thread of this process (the same code a Celery worker runs, its
Postgres and its Redis real), and a watcher (``stream_turn(tokens=True)``) reads it in
another thread. Two figures:

- latency: from the server writing a piece of text to the socket to the watcher having it
  (the first piece, and every piece), pieces ``CHUNK_SECONDS`` apart, an idle fleet;
- cost: the wall time of the same turn (a tool call, then an answer of ``REPLY_CHARS``
  characters) with the built-in loop streaming (its text through Redis, nobody watching)
  and not streaming, in alternating repetitions; the ratio is streamed / unstreamed. The
  scripted server runs in this process, so its own work on every chunk is in the streamed
  figure; a third row streams with the pieces sent nowhere, to tell the transport's share.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import ToolRegistry, tool
from durable_agent.testing import ScriptedModelServer, call_tool, reply
from durable_agent.testing.model_stream import StreamGate

from . import REDIS_URL, interleaved, scratch_database

REPLY_CHARS = 2000
CHUNK_SECONDS = 0.02
REPLY = ("The launch is on Friday at ten, in room four; bring the slides. " * 40)[:REPLY_CHARS]


@tool(replay="safe")
def lookup_note(name: str) -> str:
    """Read a note."""
    return "The launch is on Friday at 10:00 in room 4."


def policy(body: dict[str, Any]) -> dict[str, Any]:
    if body["messages"][-1]["role"] == "tool":
        return reply(REPLY)
    return call_tool("lookup_note", {"name": "launch"})


class TimedGate(StreamGate):
    """Notes when each piece of text has been written to the socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[float] = []

    def at_piece(self, sent: int) -> None:
        self.written.append(time.monotonic())
        super().at_piece(sent)


class TimedServer(ScriptedModelServer):
    def __init__(self) -> None:
        super().__init__(policy)
        self.stream_gate = self.timed = TimedGate()

    @property
    def written(self) -> list[float]:
        return self.timed.written


def run(*, turns: int = 20, latency_turns: int = 3) -> dict[str, Any]:
    with scratch_database() as url, TimedServer() as server:
        base = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=f"bench-stream-{uuid.uuid4().hex[:8]}",
            openai_base_url=server.base_url,
            openai_api_key="bench",
        )
        tools = ToolRegistry([lookup_note])
        streamed = Runtime(base.model_copy(update={"stream": True}), tools=tools)
        plain = Runtime(base.model_copy(update={"stream": False}), tools=tools)
        untransported = Runtime(base.model_copy(update={"stream": True}), tools=tools)
        untransported._parts["token_streams"] = None  # streamed, its pieces sent nowhere
        try:
            latency = _latency(streamed, server, latency_turns)
            server.chunk_seconds = 0.0
            server.piece_chars = 16
            baseline, ours = interleaved(
                lambda: _turn(plain), lambda: _turn(streamed), reps=turns, warmup=2
            )
            _, nowhere = interleaved(
                lambda: _turn(plain), lambda: _turn(untransported), reps=turns, warmup=1
            )
        finally:
            streamed.close()
            plain.close()
            untransported.close()
    result = {
        "chunk_seconds": CHUNK_SECONDS,
        "first_token_ms": latency["first"],
        "token_ms": latency["all"],
        "reply_chars": REPLY_CHARS,
        "pieces_per_reply": -(-REPLY_CHARS // 16),
        "plain_ms": baseline,
        "streamed_ms": ours,
        "streamed_nowhere_ms": nowhere,
        "ratio": statistics.median(ours) / statistics.median(baseline),
    }
    _print(result)
    return result


def _turn(runtime: Runtime) -> float:
    turn = runtime.journal.create_turn(
        f"s-{uuid.uuid4().hex[:8]}", "When is the launch?", queue=runtime.settings.queue
    )
    started = time.perf_counter()
    delivery = runtime.turn_worker().handle(turn.turn_id)
    elapsed = (time.perf_counter() - started) * 1000
    assert delivery.outcome == "done", delivery
    return elapsed


def _latency(runtime: Runtime, server: TimedServer, turns: int) -> dict[str, list[float]]:
    server.chunk_seconds = CHUNK_SECONDS
    server.piece_chars = 200
    firsts: list[float] = []
    every: list[float] = []
    for _ in range(turns):
        turn = runtime.journal.create_turn(
            f"s-{uuid.uuid4().hex[:8]}", "When is the launch?", queue=runtime.settings.queue
        )
        arrived: list[float] = []
        ready = threading.Event()

        def watch(
            turn_id: str = turn.turn_id, into: list[float] = arrived, ready: threading.Event = ready
        ) -> None:
            events = runtime.stream_turn(turn_id, tokens=True, timeout=60)
            ready.set()
            for event in events:
                if event.kind == "token":
                    into.append(time.monotonic())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ready.wait(10)
        time.sleep(0.2)  # the watcher is listening and reading the stream
        server.written.clear()
        runtime.turn_worker().handle(turn.turn_id)
        watcher.join(30)
        assert len(arrived) == len(server.written), (len(arrived), len(server.written))
        gaps = [(a - w) * 1000 for w, a in zip(server.written, arrived, strict=True)]
        firsts.append(gaps[0])
        every.extend(gaps)
    return {"first": firsts, "all": every}


def _print(result: dict[str, Any]) -> None:
    table = Table(title="streaming (python -m bench streaming)")
    table.add_column("measure")
    table.add_column("median", justify="right")
    table.add_column("p95 / max", justify="right")
    first, every = result["first_token_ms"], result["token_ms"]
    table.add_row(
        "first piece: written by the model -> at the watcher",
        f"{statistics.median(first):.1f} ms",
        f"{max(first):.1f} ms",
    )
    table.add_row(
        "every piece",
        f"{statistics.median(every):.1f} ms",
        f"{sorted(every)[int(len(every) * 0.95) - 1]:.1f} ms",
    )
    table.add_row(
        f"a turn not streamed ({result['reply_chars']:,} characters of reply)",
        f"{statistics.median(result['plain_ms']):.1f} ms",
        "",
    )
    table.add_row(
        "the same turn streamed, its pieces sent nowhere",
        f"{statistics.median(result['streamed_nowhere_ms']):.1f} ms",
        "",
    )
    table.add_row(
        f"the same turn streamed ({result['pieces_per_reply']} pieces through Redis)",
        f"{statistics.median(result['streamed_ms']):.1f} ms",
        f"ratio {result['ratio']:.2f}",
    )
    out.print(table)
