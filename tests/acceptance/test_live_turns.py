"""Live turns with real workers: a web endpoint streams a turn as server-sent events to a real
HTTP client, and ``durable-agent watch`` prints it, while the worker running the turn is
SIGKILLed and another one resumes it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

from durable_agent_examples.live_sse import make_server

from durable_agent.runtime import Runtime
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


class SseClient:
    """Reads a turn's events over HTTP; hangs up once after ``hang_up_after`` and reconnects
    with Last-Event-ID, as a browser's EventSource does."""

    def __init__(self, port: int, turn_id: str, hang_up_after: str) -> None:
        self.port, self.turn_id, self.hang_up_after = port, turn_id, hang_up_after
        self.events: list[tuple[str, str, dict[str, Any]]] = []  # (id, event, data)
        self.connections = 0
        self.statuses: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last: str | None = None
        while not self.events or self.events[-1][1] != "end":
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = last
            conn.request("GET", f"/turns/{self.turn_id}/events", headers=headers)
            response = conn.getresponse()
            self.statuses.append(response.status)
            self.connections += 1
            fields: dict[str, str] = {}
            while True:
                line = response.readline().decode()
                if not line:
                    break  # the server closed the stream
                line = line.rstrip("\n")
                if line:
                    name, _, value = line.partition(": ")
                    fields[name] = value
                    continue
                self.events.append((fields["id"], fields["event"], json.loads(fields["data"])))
                last, fields = self.events[-1][0], {}
                if last == self.hang_up_after and self.connections == 1:
                    break  # the tab closes; it comes back with Last-Event-ID
            conn.close()


def test_a_stream_goes_on_across_a_killed_worker_without_loss_or_duplicates(
    stack: Stack, spawn: Spawn
) -> None:
    """Worker 1 is SIGKILLed inside the model call of step 2; worker 2 resumes the turn. The SSE
    client (which also hangs up after step 1 and reconnects) and `durable-agent watch` each
    get steps 0-4 once, in order, and the end with the clean reply."""
    stack.on_first_request(stack.model.hold)  # answer step 0, hold step 2
    first = spawn()
    runtime = Runtime(stack.settings)
    server = make_server(runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    watch: subprocess.Popen[str] | None = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps({"session_id": "s-live", "message": stack.message})
        conn.request("POST", "/turns", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 201
        turn_id = json.loads(response.read())["turn_id"]
        conn.close()

        client = SseClient(port, turn_id, hang_up_after="1")
        client.thread.start()
        watch = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", "watch", turn_id, "--timeout", "60"],
            env={**os.environ, **settings_env(stack.settings)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stack.model.wait_for_waiting(1, timeout=20)  # step 2's request is in flight
        wait_until(lambda: client.connections == 2, 10, "the client to come back")
        assert [e[0] for e in client.events] == ["0", "1"], stack.report(turn_id)

        first.kill(signal.SIGKILL)
        assert stack.wait_exit(first, 10) == -signal.SIGKILL
        stack.model.release()
        spawn()
        client.thread.join(timeout=40)
        out, err = watch.communicate(timeout=30)
    finally:
        stack.model.release()
        server.shutdown()
        server.server_close()
        runtime.close()
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()

    report = stack.report(turn_id)
    assert client.statuses == [200, 200], report
    assert [e[0] for e in client.events] == ["0", "1", "2", "3", "4", "end"], report
    assert [e[1] for e in client.events] == ["step"] * 5 + ["end"], report
    names = [(e[2]["step"], e[2]["kind"], e[2]["name"], e[2]["replay"]) for e in client.events[:5]]
    assert names == stack.clean_steps, report
    # steps 0 and 1 came from worker 1, 2-4 from worker 2
    assert [e[2]["epoch"] for e in client.events[:5]] == [1, 1, 2, 2, 2], report
    end = client.events[-1][2]
    assert (end["status"], end["reply"]) == ("done", stack.clean_reply), report

    assert watch.returncode == 0, f"{out}\n{err}\n{report}"
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "step 0  model llm",
        "step 1  tool lookup_note (safe)",
        "step 2  model llm",
        "step 3  tool send_email (never)",
        "step 4  model llm",
        "done",
    ], out
    assert lines[-1] == f"done: {stack.clean_reply}"
    assert stack.subjects() == [stack.subject], report
