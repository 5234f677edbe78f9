"""Loopback JSON-over-HTTP plumbing shared by the test servers in this package.

`LoopbackHttpService` is a JSON HTTP server on 127.0.0.1 served from a background thread;
subclasses answer `HttpRequest`s with `HttpResponse`s. `RequestGate` holds, releases and
delays requests that are in flight, so tests can freeze a server mid-request.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlsplit

__all__ = ["LOOPBACK", "HttpRequest", "HttpResponse", "LoopbackHttpService", "RequestGate"]

LOOPBACK = "127.0.0.1"
"""The address every test server binds to by default."""


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as seen by a `LoopbackHttpService`."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """Decode the body as JSON; raises `ValueError` if it is not valid JSON."""
        return json.loads(self.body.decode("utf-8"))

    def header(self, name: str) -> str | None:
        """Return a header value, matching the name case-insensitively."""
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class HttpResponse:
    """A JSON response: status code, JSON-serialisable payload and extra headers; ``raw``
    sends those bytes as they are instead (with the Content-Type of ``headers``); ``chunks``
    sends each piece as it comes, flushed, and closes the connection after the last (a
    server-sent events stream)."""

    status: int
    payload: Any
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    chunks: Iterable[bytes] | None = None


class RequestGate:
    """Holds, releases and delays requests that are in flight, for deterministic tests.

    `hold()` makes every request that reaches `pass_through()` block until `release()`;
    `wait_for_waiting(n)` lets a test wait until n requests are blocked. `pause(seconds)`
    is an interruptible sleep. `close()` (called when the server stops) wakes everyone.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holding = False
        self._closed = False
        self._waiting = 0
        self._budget: int | None = None  # how many more requests to hold; None: all

    @property
    def waiting(self) -> int:
        """Number of requests currently blocked by `hold()`."""
        with self._cond:
            return self._waiting

    @property
    def holding(self) -> bool:
        """Whether new requests are currently being held."""
        with self._cond:
            return self._holding

    def hold(self, count: int | None = None) -> None:
        """Make requests block in `pass_through()` until `release()`; only the next
        ``count`` of them when given (later ones pass)."""
        with self._cond:
            self._holding = True
            self._budget = count

    def release(self) -> None:
        """Let every blocked request proceed and stop holding new ones."""
        with self._cond:
            self._holding = False
            self._cond.notify_all()

    def open(self) -> None:
        """Re-arm the gate after `close()` (when a server is restarted)."""
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """Wake every blocked or pausing request; used when the server stops."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def pass_through(self) -> None:
        """Block while the gate is holding (returns immediately otherwise)."""
        with self._cond:
            if not self._holding or self._closed or self._budget == 0:
                return
            if self._budget is not None:
                self._budget -= 1
            self._waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: not self._holding or self._closed)
            finally:
                self._waiting -= 1
                self._cond.notify_all()

    def pause(self, seconds: float) -> None:
        """Sleep for `seconds`, returning early if the gate is closed."""
        if seconds <= 0:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._closed, timeout=seconds)

    def wait_for_waiting(self, n: int = 1, timeout: float = 5.0) -> None:
        """Return once at least `n` requests are blocked; raise `TimeoutError` otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._waiting >= n, timeout=timeout):
                raise TimeoutError(
                    f"expected {n} held request(s) within {timeout}s, "
                    f"but only {self._waiting} arrived"
                )


class _Handler(BaseHTTPRequestHandler):
    """Turns raw HTTP into `HttpRequest`/`HttpResponse` for the owning service."""

    protocol_version = "HTTP/1.0"  # one request per connection: nothing idles at stop()
    disable_nagle_algorithm = True  # a streamed piece leaves at once, as from a real server
    timeout = 30  # a client that connects and never sends cannot pin a thread forever
    server_version = "durable-agent-testing"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests should not spam stderr."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        service = cast(_Server, self.server).service
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        parts = urlsplit(self.path)
        request = HttpRequest(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={key.lower(): value for key, value in self.headers.items()},
            body=body,
        )
        try:
            response = service.handle(request)
        except Exception as exc:  # a bug in a handler must not look like a hung server
            response = service.internal_error(exc)
        if response.chunks is not None:
            self._send_chunks(response)
            return
        data = response.raw if response.raw is not None else json.dumps(response.payload).encode()
        headers = {"Content-Type": "application/json", **response.headers}
        self.send_response(response.status)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_chunks(self, response: HttpResponse) -> None:
        # HTTP/1.0 without a Content-Length: the end of the body is the end of the connection
        self.send_response(response.status)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        for name, value in {**headers, **response.headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        assert response.chunks is not None
        for chunk in response.chunks:
            self.wfile.write(chunk)
            self.wfile.flush()


class _Server(ThreadingHTTPServer):
    """A `ThreadingHTTPServer` that knows its service and ignores vanished clients."""

    daemon_threads = True
    block_on_close = True  # server_close() joins the handler threads

    def __init__(self, address: tuple[str, int], service: LoopbackHttpService) -> None:
        self.service = service
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # Skip HTTPServer.server_bind: it does a (possibly slow) reverse DNS lookup.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return  # the client went away (e.g. a worker was killed mid-request)
        super().handle_error(request, client_address)


class LoopbackHttpService:
    """Base class: a JSON HTTP service on 127.0.0.1 served from a background thread.

    Subclasses implement `handle()`. Use as a context manager or call `start()`/`stop()`.
    With `port=0` a free port is picked on the first `start()` and kept across restarts.
    """

    def __init__(self, *, host: str = LOOPBACK, port: int = 0) -> None:
        self._host = host
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.gate = RequestGate()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and start serving in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self.gate.open()
        httpd = _Server((self._host, self._port), self)
        self._port = int(httpd.server_address[1])
        thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self._port}",
            daemon=True,
        )
        self._httpd, self._thread = httpd, thread
        thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake held requests and wait for handler threads; idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self.gate.close()
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        self._httpd = self._thread = None

    @property
    def running(self) -> bool:
        """Whether the server is currently serving."""
        return self._httpd is not None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        """The bound host (127.0.0.1 by default)."""
        return self._host

    @property
    def port(self) -> int:
        """The bound port; only meaningful after `start()` when constructed with port 0."""
        if self._port == 0:
            raise RuntimeError(f"{type(self).__name__} has not been started yet")
        return self._port

    @property
    def url(self) -> str:
        """Root URL of the service, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self._host}:{self.port}"

    # -- request handling --------------------------------------------------------------

    def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request; subclasses override this."""
        raise NotImplementedError

    def internal_error(self, exc: Exception) -> HttpResponse:
        """The response sent when `handle()` raises; subclasses may reshape it."""
        return HttpResponse(500, {"error": f"{type(exc).__name__}: {exc}"})
