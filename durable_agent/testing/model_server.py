"""A scripted, OpenAI-compatible Chat Completions server for tests.

`ScriptedModelServer` is a real HTTP server on loopback that the `openai` SDK can talk to.
Its answers come from a *policy*: a pure function of the request body that returns the
assistant message to send. Because the answer depends only on the request, a replayed
request gets a byte-identical response, and the server can count how many requests it has
already seen, which is how tests prove that a crashed turn did not pay for a model call twice.

The HTTP plumbing it is built on (`LoopbackHttpService`, `RequestGate`) lives in
`durable_agent.testing.http`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from durable_agent.testing.completions import (
    MALFORMED,
    _completion,
    _Fault,
    _malformed,
    _normalise_message,
    _openai_error,
    canonical_request,
    reply,
)
from durable_agent.testing.http import LOOPBACK, HttpRequest, HttpResponse, LoopbackHttpService
from durable_agent.testing.model_stream import StreamGate, chat_chunks
from durable_agent.testing.responses_api import chat_view, response_events, response_object

__all__ = [
    "Policy",
    "ScriptedModelServer",
    "call_tool",
    "call_tools",
    "canonical_request",
    "policy_problem",
    "reply",
    "request_digest",
    "tool_call",
]

JsonDict = dict[str, Any]
Policy = Callable[[JsonDict], JsonDict]
"""A policy maps a Chat Completions request body to the assistant message to answer with."""


PROBE: JsonDict = {
    "model": "scripted-model",
    "messages": [{"role": "user", "content": "Hello."}],
}
"""The request a policy is tried with before a server starts on it."""


def policy_problem(policy: object) -> str | None:
    """Why ``policy`` cannot be a policy, or None: it must be callable with the request
    body, and what it returns for a first user message must be an assistant message. A
    policy that raises on that probe is given the benefit of the doubt (it may answer only
    its own conversations)."""
    if not callable(policy):
        return f"it is a {type(policy).__name__}, not a function"
    try:
        inspect.signature(policy).bind(dict(PROBE))
    except TypeError:
        return "it cannot be called with one argument, the request body (policy(body) -> dict)"
    except ValueError:
        pass  # no signature to read (a builtin): the probe decides
    try:
        answer = policy(json.loads(json.dumps(PROBE)))
    except Exception:
        return None
    try:
        _normalise_message(answer, len(PROBE["messages"]))
    except (TypeError, ValueError, AttributeError) as error:
        return f"its answer to a user message is not an assistant message ({error})"
    return None


# --------------------------------------------------------------------------------------
# Policy helpers
# --------------------------------------------------------------------------------------


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


def request_digest(body: JsonDict) -> str:
    """SHA-256 hex digest of `canonical_request(body)`."""
    return hashlib.sha256(canonical_request(body).encode("utf-8")).hexdigest()


class ScriptedModelServer(LoopbackHttpService):
    """An OpenAI-compatible Chat Completions server whose answers come from a policy.

    Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/responses`` (both also streamed,
    as server-sent events, when asked: see ``model_stream.py``), ``GET /v1/models``, ``GET
    /_stats`` (counts as JSON, for tests in other processes) and ``POST /_reset``. Control
    endpoints for a server in another process: ``POST /_fail`` ``{"n", "status"}``, ``POST
    /_hold``, ``POST /_release``, ``POST /_delay`` ``{"seconds", "chunk_seconds"}`` and
    ``POST /_limit`` ``{"tpm"}`` (answer 429 past that many tokens a minute, as a provider does).

    Streams: ``chunk_seconds`` between two events, ``piece_chars`` characters of text a
    piece; ``hold_stream(after)`` stops every stream after that many pieces until
    ``release()``. ``reasoning=True`` puts a reasoning item first in each Response.

    Every well-formed chat completion request is recorded when it arrives, including those
    answered with an injected fault (so a client retry shows up as a repeated request).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        model: str = "scripted-model",
        host: str = LOOPBACK,
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.policy = policy
        self.model = model
        self.delay_seconds: float = 0.0
        self.chunk_seconds: float = 0.0
        self.piece_chars: int = 4
        self.reasoning = False
        self.stream_gate = StreamGate()
        self.streams = 0  # how many answers were streamed
        self.tpm_limit: int | None = None  # tokens a minute before answering 429
        self._spent: deque[tuple[float, int]] = deque()  # (when, tokens) within the minute
        self.rate_limited = 0  # how many 429s the limit sent
        self.fail_message: str | None = None  # the error text of injected failures
        self._lock = threading.Lock()
        self._requests: list[JsonDict] = []
        self._digests: list[str] = []
        self._usage: list[JsonDict] = []  # of every completion served, as a provider bills
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

    def billed(self) -> JsonDict:
        """What a provider would bill: the completions served (also those whose client had
        gone by then) and the sum of their ``usage``. Faults are not billed."""
        with self._lock:
            usage = list(self._usage)
        return {
            "calls": len(usage),
            "prompt_tokens": sum(u["prompt_tokens"] for u in usage),
            "completion_tokens": sum(u["completion_tokens"] for u in usage),
        }

    def reset_counts(self) -> None:
        """Forget every recorded request (faults, delay and hold are untouched)."""
        with self._lock:
            self._requests.clear()
            self._digests.clear()
            self._usage.clear()

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

    def answer_next_malformed(self, kind: str, n: int = 1) -> None:
        """Answer the next `n` chat completion requests with a malformed success
        (see `MALFORMED`): what a real endpoint or a proxy in front of it sometimes sends."""
        if kind not in MALFORMED:
            raise ValueError(f"kind must be one of {sorted(MALFORMED)}, got {kind!r}")
        with self._lock:
            self._faults.extend(_Fault(200, None, kind) for _ in range(n))

    def hold(self) -> None:
        """Block incoming chat completion requests (after they are counted) until `release()`."""
        self.gate.hold()

    def release(self) -> None:
        """Let held requests and streams proceed and stop holding new ones."""
        self.gate.release()
        self.stream_gate.release()

    def hold_stream(self, after: int = 1) -> None:
        """Stop every stream in flight after ``after`` pieces of text until ``release()``."""
        self.stream_gate.hold(after)

    def wait_for_held_stream(self, n: int = 1, timeout: float = 5.0) -> None:
        """Return once ``n`` streams are held by ``hold_stream()``."""
        self.stream_gate.wait_for_waiting(n, timeout)

    def stop(self) -> None:
        self.stream_gate.close()
        super().stop()
        self.stream_gate.open()

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
        if route == ("POST", "/v1/responses"):
            return self._chat_completion(request, responses=True)
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
        elif path == "/_limit":
            tpm = args.get("tpm")
            self.tpm_limit = None if tpm is None else int(tpm)
        else:  # /_delay
            self.delay_seconds = float(args.get("seconds", 0.0))
            self.chunk_seconds = float(args.get("chunk_seconds", self.chunk_seconds))
        return HttpResponse(200, self.stats())

    def _chat_completion(self, request: HttpRequest, *, responses: bool = False) -> HttpResponse:
        try:
            body = request.json()
        except (ValueError, UnicodeDecodeError):
            return _openai_error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return _openai_error(400, "The request body must be a JSON object.")
        if responses:
            if not isinstance(body.get("input"), list | str) or not body["input"]:
                return _openai_error(400, "'input' is required and must be text or an array.")
            body.setdefault("model", self.model)
            view = chat_view(body)
        else:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _openai_error(400, "'messages' is required and must be a non-empty array.")
            body.setdefault("model", self.model)
            view = body
        digest = request_digest(body)
        with self._lock:
            self._requests.append(body)
            self._digests.append(digest)
            fault = self._faults.popleft() if self._faults else None

        self.gate.pass_through()
        self.gate.pause(self.delay_seconds)

        if fault is None and self._over_limit(body):
            fault = _Fault(429, 0.5)
        if fault is not None and fault.kind != "error":
            return _malformed(fault.kind, view, digest, stream=bool(body.get("stream")))
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(round(fault.retry_after * 1000))
            return _openai_error(
                fault.status,
                self.fail_message or f"Injected failure ({fault.status}).",
                headers=headers,
            )
        answer = self.policy(json.loads(json.dumps(view)))
        message = _normalise_message(answer, len(view["messages"]))
        completion = _completion(view, message, digest)
        if responses:
            completion = response_object(
                body, message, digest, completion["usage"], reasoning=self.reasoning
            )
        self._spend(completion)
        if not body.get("stream"):
            return HttpResponse(200, completion)
        with self._lock:
            self.streams += 1
        if responses:
            events = response_events(
                completion, piece_chars=self.piece_chars, pause=self._pause, gate=self.stream_gate
            )
        else:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = chat_chunks(
                completion,
                include_usage=include_usage,
                piece_chars=self.piece_chars,
                pause=self._pause,
                gate=self.stream_gate,
            )
        return HttpResponse(200, None, chunks=events)

    def _pause(self) -> None:
        self.gate.pause(self.chunk_seconds)

    def _spend(self, completion: JsonDict) -> None:
        usage = completion["usage"]
        billed = {
            "prompt_tokens": usage.get("prompt_tokens", usage.get("input_tokens", 0)),
            "completion_tokens": usage.get("completion_tokens", usage.get("output_tokens", 0)),
        }
        with self._lock:
            self._usage.append(billed)
            self._spent.append((time.monotonic(), sum(billed.values())))

    def _over_limit(self, body: JsonDict) -> bool:
        """Whether this request would take the last minute's tokens past ``tpm_limit`` (its
        prompt counted as it will be billed, its answer not yet known)."""
        if self.tpm_limit is None:
            return False
        now = time.monotonic()
        prompt = max(1, len(canonical_request(body)) // 4)
        with self._lock:
            while self._spent and now - self._spent[0][0] >= 60.0:
                self._spent.popleft()
            if sum(tokens for _, tokens in self._spent) + prompt > self.tpm_limit:
                self.rate_limited += 1
                return True
        return False


_CONTROL_PATHS = frozenset({"/_reset", "/_fail", "/_hold", "/_release", "/_delay", "/_limit"})
