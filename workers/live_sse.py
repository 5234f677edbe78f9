"""A turn's steps as server-sent events, from a web endpoint (stdlib only).

    POST /turns                      {"session_id": "...", "message": "..."} -> {"turn_id": "..."}
    GET  /turns/<turn_id>/events     text/event-stream: one ``step`` event per finished step
                                     (``id`` = its step number), then one ``end`` event

A browser's ``EventSource`` that loses its connection reconnects with ``Last-Event-ID``, the
last step it got; the stream goes on after that step, so the page misses nothing and shows
nothing twice, even when the worker running the turn died and another one resumed it. One
that reconnects after the end (``Last-Event-ID: end``) gets 204 No Content, which tells an
``EventSource`` to stop reconnecting.
``?after_step=N`` does the same by hand.

``GET /turns/<turn_id>/events?tokens=1`` adds the model's text as it is written (``token``
events, then ``abandoned`` if a worker died mid-answer); the ids are then cursors, and
``Last-Event-ID`` goes on from one the same way.

Run it with ``python -m durable_agent_examples.live_sse --port 8000`` (the settings come
from ``DURABLE_AGENT_*``, as for the workers).
"""

from __future__ import annotations

import json
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_agent import DurableAgentError, InvalidArgument, Runtime, TurnNotFound, runtime_for
from durable_agent.usage import OneLineParser, port


def make_server(runtime: Runtime, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for ``runtime``'s turns (port 0: any free port); call
    ``serve_forever()`` on it, ``shutdown()`` to stop."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/turns":
                return self._json(HTTPStatus.NOT_FOUND, {"error": "no such endpoint"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                turn_id = runtime.start_turn(str(body["session_id"]), str(body["message"]))
            except (ValueError, KeyError, TypeError, InvalidArgument) as error:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
            self._json(HTTPStatus.CREATED, {"turn_id": turn_id})

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "turns" or parts[2] != "events":
                return self._json(HTTPStatus.NOT_FOUND, {"error": "no such endpoint"})
            turn_id = urllib.parse.unquote(parts[1])
            query = urllib.parse.parse_qs(url.query)
            last = self.headers.get("Last-Event-ID") or (query.get("after_step") or ["-1"])[0]
            tokens = (query.get("tokens") or ["0"])[0] == "1"
            if last.strip() == "end":  # it had the end: 204 tells an EventSource to stop
                return self._no_more_events(turn_id)
            try:
                # an unknown turn or a bad step fails here, before the headers
                if tokens:
                    events = runtime.stream_turn(turn_id, tokens=True, after=last)
                else:
                    events = runtime.stream_turn(turn_id, after_step=int(last))
            except TurnNotFound as error:
                return self._json(HTTPStatus.NOT_FOUND, {"error": str(error)})
            except (ValueError, InvalidArgument) as error:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            try:
                for event in events:
                    data = json.dumps(event.as_json(), ensure_ascii=False)
                    self.wfile.write(
                        f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n".encode()
                    )
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; it comes back with Last-Event-ID
            except DurableAgentError as error:  # Postgres went away: the client retries
                self.log_error("stream of %s stopped: %s", turn_id, error)
            finally:
                events.close()

        def _no_more_events(self, turn_id: str) -> None:
            try:
                runtime.get_turn(turn_id)
            except TurnNotFound as error:
                return self._json(HTTPStatus.NOT_FOUND, {"error": str(error)})
            except InvalidArgument as error:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
            self.send_response(HTTPStatus.NO_CONTENT)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    parser = OneLineParser(
        prog="python -m durable_agent_examples.live_sse",
        description="server-sent events of durable-agent turns",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=8000)
    args = parser.parse_args()
    server = make_server(runtime_for(), args.host, args.port)
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
