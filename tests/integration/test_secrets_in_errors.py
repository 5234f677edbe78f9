"""The configured API key never reaches ``turns.error``, however the model's error body
echoes it: a key without the ``sk-`` prefix, quoted alone, or URL-encoded after ``bearer``."""

from __future__ import annotations

import pytest

from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, reply

HEX_KEY = "9b1e4c7d2a3f5e6b8c0d1e2f3a4b5c6d"
PLAIN_TOKEN = "ollama-local-token"


@pytest.mark.parametrize("key", [HEX_KEY, PLAIN_TOKEN], ids=["32-hex-key", "plain-token"])
@pytest.mark.parametrize("status", [401, 400])
def test_a_model_error_body_echoing_the_key_is_stored_without_it(
    settings: Settings, key: str, status: int
) -> None:
    with ScriptedModelServer(lambda body: reply("never")) as model:
        model.fail_message = (
            f"Incorrect API key provided: {key}. You sent 'authorization: bearer%20{key}'; "
            f'"{key}" is not a key.'
        )
        model.fail_next(1, status)
        runtime = Runtime(
            settings.model_copy(update={"openai_base_url": model.base_url, "openai_api_key": key}),
        )
        try:
            turn = runtime.journal.create_turn("s", "hello")
            delivery = TurnWorker(runtime).handle(turn.turn_id)
            ended = runtime.get_turn(turn.turn_id)
        finally:
            runtime.close()
    assert delivery.outcome == "failed", delivery
    assert ended.status == "failed" and ended.error is not None
    assert key not in ended.error, ended.error
    assert key not in delivery.detail
    assert "Incorrect API key provided: ***" in ended.error, ended.error
    assert "bearer%20***" in ended.error, ended.error
