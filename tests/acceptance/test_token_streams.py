"""Tokens of streamed answers with real workers: the real ``openai`` SDK streams from the
scripted model server (SSE), the worker puts the text on the turn's Redis stream, and
watchers (``stream_turn(tokens=True)``, ``durable-agent watch --tokens``) get the text, then
the finished step, then the end; across a worker SIGKILLed mid-stream they are told the
attempt was abandoned and get the new attempt from its start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import redis

from durable_agent.operate.live import TurnEvent
from durable_agent.operate.tokens import stream_key
from durable_agent.runtime import Runtime
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


class Watcher:
    """``stream_turn(tokens=True)`` in a thread, keeping every event."""

    def __init__(self, runtime: Runtime, turn_id: str, after: str | None = None) -> None:
        self.events: list[TurnEvent] = []
        self.error: BaseException | None = None
        self.stream = runtime.stream_turn(turn_id, tokens=True, after=after, timeout=60)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.stream:
                self.events.append(event)
        except BaseException as error:  # reported by the test
            self.error = error

    def join(self, timeout: float = 60) -> list[TurnEvent]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the watcher did not reach the end"
        assert self.error is None, self.error
        return self.events


def shape(events: list[TurnEvent]) -> list[tuple[str, int | None, int | None]]:
    """(kind, step, attempt) of each event, tokens of one attempt folded into one."""
    out: list[tuple[str, int | None, int | None]] = []
    for e in events:
        step = e.step.step if e.step is not None else e.step_number
        item = (e.kind, step, e.attempt)
        if e.kind == "token" and out and out[-1] == item:
            continue
        out.append(item)
    return out


def text_of(events: list[TurnEvent], step: int, attempt: int) -> str:
    return "".join(
        e.text
        for e in events
        if e.kind == "token" and (e.step_number, e.attempt) == (step, attempt)
    )


def test_a_watcher_gets_the_text_as_it_is_written_then_the_step_then_the_end(
    stack: Stack, spawn: Spawn
) -> None:
    """Prefork worker; the model sends its final answer in pieces 20 ms apart. The watcher
    gets every piece before the step, the pieces make the recorded reply. A watcher that hangs
    up after 5 pieces (the stream held after 6) and comes back with the fifth's id gets the
    rest: nothing twice, nothing skipped. The journal holds the finished message only; the
    pieces are in Redis, with an expiry."""
    stack.model.chunk_seconds = 0.02
    stack.model.hold_stream(after=6)
    spawn(pool="prefork", concurrency=2)
    runtime = Runtime(stack.settings)
    try:
        turn_id = runtime.start_turn("s-tokens", stack.message)
        watcher = Watcher(runtime, turn_id)
        hung_up: list[TurnEvent] = []
        for event in runtime.stream_turn(turn_id, tokens=True, timeout=60):
            hung_up.append(event)
            if event.kind == "token" and sum(e.kind == "token" for e in hung_up) == 5:
                break  # the tab closes
        stack.model.wait_for_held_stream(1, timeout=30)
        back = Watcher(runtime, turn_id, after=hung_up[-1].id)
        wait_until(lambda: bool(back.events), 10, "the sixth piece, sent before the hold")
        stack.model.release()
        events = watcher.join()
        rest = back.join()
        turn = stack.wait_turn(turn_id)
        assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
        assert shape(events) == [
            ("step", 0, None),
            ("step", 1, None),
            ("step", 2, None),
            ("step", 3, None),
            ("token", 4, 1),
            ("step", 4, None),
            ("end", None, None),
        ], stack.report(turn_id)
        assert text_of(events, 4, 1) == stack.clean_reply
        tokens = [e for e in events if e.kind == "token"]
        assert len(tokens) > 6
        assert [e.kind for e in rest] == ["token"] * (len(tokens) - 5) + ["step", "end"]
        assert text_of(hung_up, 4, 1) + text_of(rest, 4, 1) == stack.clean_reply
        # a watcher that comes after the end gets the step whole, no tokens
        late = Watcher(runtime, turn_id).join()
        assert [e.kind for e in late] == ["step"] * 5 + ["end"]
        # the journal has the message, the stream has the pieces
        steps = stack.journal(turn_id)
        assert steps[4].output["message"]["content"] == stack.clean_reply
        client = redis.Redis.from_url(stack.settings.broker_url)
        try:
            # every model call: start and finish; the last one's pieces between
            assert client.xlen(stream_key(turn_id)) == len(tokens) + 3 * 2
            assert 0 < client.ttl(stream_key(turn_id)) <= stack.settings.token_stream_ttl_seconds
        finally:
            client.close()
        assert stack.model.streams == 3  # every model call was streamed
        # the ledger counts the usage of the streams' last chunks: what the model billed
        spend = runtime.get_turn(turn_id).spend
        assert spend is not None and spend.calls_without_usage == 0
        billed = stack.model.billed()
        assert (spend.billed.calls, spend.billed.prompt_tokens, spend.billed.completion_tokens) == (
            billed["calls"],
            billed["prompt_tokens"],
            billed["completion_tokens"],
        )
    finally:
        stack.model.release()
        runtime.close()


def test_a_worker_killed_mid_stream_its_attempt_abandoned_then_the_new_one_from_its_start(
    stack: Stack, spawn: Spawn
) -> None:
    """The prefork worker is SIGKILLed after 3 pieces of the final answer. The watcher (and
    `durable-agent watch --tokens`) are told attempt 1 of step 4 was abandoned, then get
    attempt 2 from its first piece to the step, never a splice of the two."""
    stack.model.hold_stream(after=3)
    first = spawn(pool="prefork", concurrency=1)
    runtime = Runtime(stack.settings)
    watch: subprocess.Popen[str] | None = None
    try:
        turn_id = runtime.start_turn("s-kill", stack.message)
        watcher = Watcher(runtime, turn_id)
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable_agent",
                "watch",
                turn_id,
                "--tokens",
                "--timeout",
                "60",
            ],
            env={**os.environ, **settings_env(stack.settings)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stack.model.wait_for_held_stream(1, timeout=30)
        wait_until(
            lambda: sum(e.kind == "token" for e in watcher.events) == 3, 10, "three pieces seen"
        )
        first.kill(signal.SIGKILL)
        assert stack.wait_exit(first, 10) == -signal.SIGKILL
        stack.model.release()
        spawn(pool="prefork", concurrency=1)
        events = watcher.join()
        out, err = watch.communicate(timeout=60)
    finally:
        stack.model.release()
        runtime.close()
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()
    report = stack.report(turn_id)
    turn = stack.wait_turn(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    kinds = shape(events)
    second = kinds[6][2]
    assert kinds == [
        ("step", 0, None),
        ("step", 1, None),
        ("step", 2, None),
        ("step", 3, None),
        ("token", 4, 1),
        ("abandoned", 4, 1),
        ("token", 4, second),
        ("step", 4, None),
        ("end", None, None),
    ], report
    assert second is not None and second > 1
    assert text_of(events, 4, 1) == stack.clean_reply[: 3 * stack.model.piece_chars]
    assert text_of(events, 4, second) == stack.clean_reply  # from its start, whole
    assert watch.returncode == 0, err
    assert "step 4: attempt 1 abandoned" in out, out
    assert f"step 4 (attempt {second})> {stack.clean_reply}" in out, out
    assert out.rstrip().endswith(f"done: {stack.clean_reply}"), out


def test_the_stdlib_sse_example_streams_tokens_and_goes_on_from_last_event_id(
    stack: Stack, spawn: Spawn
) -> None:
    """``live_sse`` with ``?tokens=1``: a real HTTP client gets the pieces, hangs up after two
    (the answer held after three), comes back with ``Last-Event-ID`` and gets the rest."""
    import http.client
    import json

    from durable_agent_examples.live_sse import make_server

    stack.model.hold_stream(after=3)
    spawn()
    runtime = Runtime(stack.settings)
    server = make_server(runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def read(
        turn_id: str, last: str | None, stop_after_tokens: int | None, events: list[Any]
    ) -> list[Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Last-Event-ID": last} if last else {}
        conn.request("GET", f"/turns/{turn_id}/events?tokens=1", headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        fields: dict[str, str] = {}
        while True:
            line = response.readline().decode()
            if not line:
                break
            if line.strip():
                name, _, value = line.strip().partition(": ")
                fields[name] = value
                continue
            events.append((fields["id"], fields["event"], json.loads(fields["data"])))
            fields = {}
            tokens = sum(e[1] == "token" for e in events)
            if stop_after_tokens is not None and tokens == stop_after_tokens:
                break
        conn.close()
        return events

    try:
        turn_id = runtime.start_turn("s-sse-tokens", stack.message)
        first = read(turn_id, None, 2, [])
        stack.model.wait_for_held_stream(1, timeout=30)
        rest: list[Any] = []
        reader = threading.Thread(target=read, args=(turn_id, first[-1][0], None, rest))
        reader.start()
        # the third piece was written before the hold: the reader has it, then the rest
        wait_until(lambda: any(e[1] == "token" for e in rest), 10, "the third piece")
        stack.model.release()
        reader.join(60)
    finally:
        stack.model.release()
        server.shutdown()
        server.server_close()
        runtime.close()
    report = stack.report(turn_id)
    events = first + rest
    assert [e[1] for e in events[:4]] == ["step"] * 4, report
    assert [e[1] for e in events[-2:]] == ["step", "end"], report
    text = "".join(e[2]["text"] for e in events if e[1] == "token")
    assert text == stack.clean_reply, report
    assert len({e[0] for e in events}) == len(events)  # no event twice
