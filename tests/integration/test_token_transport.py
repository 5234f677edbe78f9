"""The token transport never fails a turn: with its Redis unreachable a streamed turn runs to
the end, and its watchers get the finished steps."""

from __future__ import annotations

import socket

from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import ToolRegistry, tool
from durable_agent.testing import ScriptedModelServer, reply


@tool(replay="safe", name="it_tokens_noop")
def noop() -> str:
    """Nothing."""
    return "ok"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_streamed_turn_ends_when_the_token_streams_redis_is_gone(settings: Settings) -> None:
    with ScriptedModelServer(lambda body: reply("All is well, streamed.")) as model:
        runtime = Runtime(
            settings.model_copy(
                update={
                    "openai_base_url": model.base_url,
                    "token_stream_url": f"redis://127.0.0.1:{closed_port()}/0",
                }
            ),
            tools=ToolRegistry([noop]),
        )
        try:
            turn = runtime.journal.create_turn("s-no-redis", "hi", queue=runtime.settings.queue)
            delivery = runtime.turn_worker().handle(turn.turn_id)
            assert delivery.outcome == "done", delivery
            assert model.streams == 1
            events = list(runtime.stream_turn(turn.turn_id, timeout=10))
            assert [e.kind for e in events] == ["step", "end"]
            assert events[-1].turn is not None
            assert events[-1].turn.reply == "All is well, streamed."
        finally:
            runtime.close()
