"""An agent on the Responses API with real workers: the real ``openai`` SDK streams
``/v1/responses`` from the scripted model server, reasoning items and function calls
round-trip through the journal, and a worker SIGKILLed mid-turn is resumed by another one
that sends the same request again, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from durable_agent import start_turn
from durable_agent.testing.harness import settings_env

if TYPE_CHECKING:
    from conftest import Spawn, Stack

AGENTS = "durable_agent_examples.responses_agent"


def test_a_responses_turn_resumed_after_a_kill_sends_the_same_requests(
    stack: Stack, spawn: Spawn
) -> None:
    stack.model.reasoning = True
    settings = stack.settings.model_copy(update={"agents": AGENTS})
    stack.on_first_request(stack.model.hold)  # answer step 0, hold step 2
    first = spawn(settings=settings, pool="prefork", concurrency=1)
    turn_id = start_turn("s-responses", stack.message, agent="mailer", settings=settings)
    stack.model.wait_for_waiting(1, timeout=30)  # step 2's request is in flight
    first.kill(signal.SIGKILL)
    assert stack.wait_exit(first, 10) == -signal.SIGKILL
    stack.model.release()
    spawn(settings=settings)
    turn = stack.wait_turn(turn_id)
    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert stack.subjects() == [stack.subject], report  # one email

    requests = stack.model.requests
    assert all("input" in r and "messages" not in r for r in requests), report
    assert all(r["store"] is False for r in requests)
    assert all(r["include"] == ["reasoning.encrypted_content"] for r in requests)
    assert all(r["tools"][0]["type"] == "function" and "name" in r["tools"][0] for r in requests)
    # step 2 was sent by both workers, the same request; nothing else twice
    digests = stack.model.request_digests()
    assert len(requests) == 4 and digests[1] == digests[2], report
    assert stack.model.repeated_requests() == 1
    # the reasoning item and the function call of step 0 went back as they came
    step0 = stack.journal(turn_id)[0].output
    assert [i["type"] for i in step0["output"]] == ["reasoning", "function_call"]
    resent = requests[2]["input"][1:3]
    assert resent == step0["output"]
    assert requests[2]["input"][3]["type"] == "function_call_output"
    assert requests[2]["instructions"] == stack.settings.system_prompt
    # a replay walks the loop over the journal with the model switched off: same requests
    replay = subprocess.run(
        [sys.executable, "-m", "durable_agent", "replay", turn_id, "--json"],
        env={**os.environ, **settings_env(settings), **stack.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["ok"] is True
