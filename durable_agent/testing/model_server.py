"""A scripted, OpenAI-compatible Chat Completions server for tests.

`ScriptedModelServer` is a real HTTP server on loopback that the `openai` SDK can talk to.
Its answers come from a *policy*: a pure function of the request body that returns the
assistant message to send. Because the answer depends only on the request, a replayed
request gets a byte-identical response, and the server can count how many requests it has
already seen, which is how tests prove that a crashed turn did not pay for a model call twice.

This module also holds the small building blocks shared by the other test servers in this
package: `LoopbackHttpService` (a JSON-over-HTTP server in a background thread) and
`RequestGate` (hold, release and delay requests that are in flight).
"""

from __future__ import annotations

import hashlib
import json
import socketserver
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "HttpRequest",
    "HttpResponse",
    "LoopbackHttpService",
    "Policy",
    "RequestGate",
    "ScriptedModelServer",
    "call_tool",
    "call_tools",
    "canonical_request",
    "reply",
    "request_digest",
    "tool_call",
]

JsonDict = dict[str, Any]
Policy = Callable[[JsonDict], JsonDict]
"""A policy maps a Chat Completions request body to the assistant message to answer with."""

_LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------------------
# Shared HTTP plumbing
# --------------------------------------------------------------------------------------


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
    """A JSON response: status code, JSON-serialisable payload and extra headers."""

    status: int
    payload: Any
    headers: dict[str, str] = field(default_factory=dict)


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
        data = json.dumps(response.payload).encode("utf-8")
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


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

    def __init__(self, *, host: str = _LOOPBACK, port: int = 0) -> None:
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


# --------------------------------------------------------------------------------------
# Policy helpers
# --------------------------------------------------------------------------------------


def reply(content: str) -> JsonDict:
    """A final assistant message with text and no tool calls."""
    return {"role": "assistant", "content": content}


def tool_call(name: str, args: JsonDict | None = None, *, call_id: str | None = None) -> JsonDict:
    """One tool call in OpenAI form, for `call_tools()`.

    Leave `call_id` as None to let the server assign a deterministic id derived from the
    request (``call_<len(messages)>_<index>``).
    """
    call: JsonDict = {
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args or {}, separators=(",", ":"))},
    }
    if call_id is not None:
        call["id"] = call_id
    return call


def call_tools(*calls: JsonDict, content: str | None = None) -> JsonDict:
    """An assistant message that calls one or several tools (built with `tool_call()`)."""
    if not calls:
        raise ValueError("call_tools() needs at least one tool_call()")
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def call_tool(
    name: str,
    args: JsonDict | None = None,
    *,
    call_id: str | None = None,
    content: str | None = None,
) -> JsonDict:
    """An assistant message that calls a single tool."""
    return call_tools(tool_call(name, args, call_id=call_id), content=content)


# --------------------------------------------------------------------------------------
# Canonical request form and counting
# --------------------------------------------------------------------------------------


def canonical_request(body: JsonDict) -> str:
    """The canonical text of a request: its model, messages and tools as sorted compact JSON.

    Two requests with the same canonical text are the same model call; everything else in the
    body (temperature, headers, ...) is ignored.
    """
    key = {"model": body.get("model"), "messages": body.get("messages"), "tools": body.get("tools")}
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def request_digest(body: JsonDict) -> str:
    """SHA-256 hex digest of `canonical_request(body)`."""
    return hashlib.sha256(canonical_request(body).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class _Fault:
    status: int
    retry_after: float | None


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def _openai_error(
    status: int, message: str, *, headers: dict[str, str] | None = None
) -> HttpResponse:
    error_type, code = _ERROR_TYPES.get(status, ("server_error", None))
    payload = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return HttpResponse(status, payload, headers or {})


class ScriptedModelServer(LoopbackHttpService):
    """An OpenAI-compatible Chat Completions server whose answers come from a policy.

    Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /_stats`` (counts as
    JSON, for tests in other processes) and ``POST /_reset``. Control endpoints for a server
    in another process: ``POST /_fail`` ``{"n", "status"}``, ``POST /_hold``, ``POST
    /_release`` and ``POST /_delay`` ``{"seconds"}``.

    Every well-formed chat completion request is recorded when it arrives, including those
    answered with an injected fault (so a client retry shows up as a repeated request).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        model: str = "scripted-model",
        host: str = _LOOPBACK,
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.policy = policy
        self.model = model
        self.delay_seconds: float = 0.0
        self._lock = threading.Lock()
        self._requests: list[JsonDict] = []
        self._digests: list[str] = []
        self._faults: deque[_Fault] = deque()

    # -- addresses ---------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The URL to give the SDK: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    # -- counting ----------------------------------------------------------------------

    @property
    def requests(self) -> list[JsonDict]:
        """A snapshot of every chat completion request body received, in order."""
        with self._lock:
            return [json.loads(json.dumps(body)) for body in self._requests]

    @property
    def request_count(self) -> int:
        """How many chat completion requests were received."""
        with self._lock:
            return len(self._requests)

    def request_digests(self) -> list[str]:
        """`request_digest()` of every request received, in order."""
        with self._lock:
            return list(self._digests)

    def repeated_requests(self) -> int:
        """How many requests had a canonical form already seen earlier."""
        seen: set[str] = set()
        repeated = 0
        for digest in self.request_digests():
            if digest in seen:
                repeated += 1
            seen.add(digest)
        return repeated

    def reset_counts(self) -> None:
        """Forget every recorded request (faults, delay and hold are untouched)."""
        with self._lock:
            self._requests.clear()
            self._digests.clear()

    def stats(self) -> JsonDict:
        """The counts served at ``GET /_stats``."""
        digests = self.request_digests()
        return {
            "requests": len(digests),
            "repeated": len(digests) - len(set(digests)),
            "digests": digests,
            "waiting": self.gate.waiting,
        }

    # -- fault injection ---------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: float | None = None) -> None:
        """Answer the next `n` chat completion requests with `status` and an OpenAI error.

        `retry_after` (seconds) is sent as ``retry-after-ms`` so SDK retries can be fast.
        """
        if status < 400:
            raise ValueError("fail_next() needs an error status (>= 400)")
        with self._lock:
            self._faults.extend(_Fault(status, retry_after) for _ in range(n))

    def hold(self) -> None:
        """Block incoming chat completion requests (after they are counted) until `release()`."""
        self.gate.hold()

    def release(self) -> None:
        """Let held requests proceed and stop holding new ones."""
        self.gate.release()

    def wait_for_waiting(self, n: int = 1, timeout: float = 5.0) -> None:
        """Return once `n` requests are blocked by `hold()`; raise `TimeoutError` otherwise."""
        self.gate.wait_for_waiting(n, timeout)

    # -- HTTP --------------------------------------------------------------------------

    def internal_error(self, exc: Exception) -> HttpResponse:
        return _openai_error(
            500, f"{type(exc).__name__}: {exc}", headers={"x-should-retry": "false"}
        )

    def handle(self, request: HttpRequest) -> HttpResponse:
        route = (request.method, request.path.rstrip("/"))
        if route == ("POST", "/v1/chat/completions"):
            return self._chat_completion(request)
        if route == ("GET", "/v1/models"):
            model = {"id": self.model, "object": "model", "created": 0, "owned_by": "testing"}
            return HttpResponse(200, {"object": "list", "data": [model]})
        if route == ("GET", "/_stats"):
            return HttpResponse(200, self.stats())
        if route[0] == "POST" and route[1] in _CONTROL_PATHS:
            return self._control(route[1], request)
        return _openai_error(404, f"Unknown request URL: {request.method} {request.path}")

    def _control(self, path: str, request: HttpRequest) -> HttpResponse:
        try:
            args = request.json() if request.body else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return _openai_error(400, "control body must be a JSON object")
        if path == "/_reset":
            self.reset_counts()
        elif path == "/_fail":
            self.fail_next(int(args.get("n", 1)), int(args.get("status", 500)))
        elif path == "/_hold":
            self.hold()
        elif path == "/_release":
            self.release()
        else:  # /_delay
            self.delay_seconds = float(args.get("seconds", 0.0))
        return HttpResponse(200, self.stats())

    def _chat_completion(self, request: HttpRequest) -> HttpResponse:
        try:
            body = request.json()
        except (ValueError, UnicodeDecodeError):
            return _openai_error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return _openai_error(400, "The request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _openai_error(400, "'messages' is required and must be a non-empty array.")
        if body.get("stream"):
            return _openai_error(400, "ScriptedModelServer does not support streaming.")
        body.setdefault("model", self.model)
        digest = request_digest(body)
        with self._lock:
            self._requests.append(body)
            self._digests.append(digest)
            fault = self._faults.popleft() if self._faults else None

        self.gate.pass_through()
        self.gate.pause(self.delay_seconds)

        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(round(fault.retry_after * 1000))
            return _openai_error(
                fault.status, f"Injected failure ({fault.status}).", headers=headers
            )
        answer = self.policy(json.loads(json.dumps(body)))
        message = _normalise_message(answer, len(messages))
        return HttpResponse(200, _completion(body, message, digest))


_CONTROL_PATHS = frozenset({"/_reset", "/_fail", "/_hold", "/_release", "/_delay"})


def _normalise_message(answer: JsonDict, n_messages: int) -> JsonDict:
    """Validate a policy's answer and fill in deterministic tool call ids."""
    if not isinstance(answer, dict):
        raise TypeError(f"policy must return a dict, got {type(answer).__name__}")
    content = answer.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("policy answer 'content' must be a string or None")
    message: JsonDict = {"role": "assistant", "content": content}
    calls = answer.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            _normalise_call(call, f"call_{n_messages}_{index}") for index, call in enumerate(calls)
        ]
    elif content is None:
        raise ValueError("policy answer needs 'content' or 'tool_calls'")
    return message


def _normalise_call(call: JsonDict, default_id: str) -> JsonDict:
    function = call.get("function") or {}
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool call without a function name: {call!r}")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, separators=(",", ":"))
    return {
        "id": call.get("id") or default_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _completion(body: JsonDict, message: JsonDict, digest: str) -> JsonDict:
    """Build a ChatCompletion whose every byte is a function of the request."""
    prompt_tokens = max(1, len(canonical_request(body)) // 4)
    completion_tokens = max(1, len(json.dumps(message)) // 4)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
