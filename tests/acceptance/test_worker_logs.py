"""What a real worker writes to its log: one line per record, whatever a model replies,
and never the configured API key, whatever the model's error body echoes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_agent import start_turn
from durable_agent.testing import reply

if TYPE_CHECKING:
    from conftest import Spawn, Stack

KEY = "5d41402abc4b2a76b9719d911017c592"  # 32 hex digits: no pattern recognises it
FORGED = "ERROR durable_agent.delivery.turn_worker: turn turn_forged failed: forged"


def test_a_reply_cannot_forge_a_log_line_and_the_key_never_reaches_the_log(
    stack: Stack, spawn: Spawn
) -> None:
    settings = stack.settings.model_copy(update={"openai_api_key": KEY})

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        return reply(f"Sure.\n{FORGED}\x1b[2J\x1b[31m")

    stack.model.policy = policy
    worker = spawn(settings=settings)
    forged = stack.wait_turn(start_turn("s-forge", "hello", settings=settings))
    assert forged.status == "done" and forged.reply is not None and "\n" in forged.reply

    stack.model.fail_message = (
        f"Incorrect API key provided: {KEY}. Sent: authorization: bearer%20{KEY}; '{KEY}'"
    )
    stack.model.fail_next(1, 401)
    refused = stack.wait_turn(start_turn("s-key", "hello", settings=settings))
    assert refused.status == "failed" and refused.error is not None
    assert KEY not in refused.error, refused.error

    log = worker.log_text()
    assert f"Sure.\\n{FORGED}\\x1b[2J\\x1b[31m" in log, log  # logged, escaped
    assert not any(line.startswith("ERROR durable_agent") for line in log.splitlines()), log
    assert "\x1b" not in log, log
    assert "Incorrect API key provided: ***" in log, log
    assert KEY not in log, log
