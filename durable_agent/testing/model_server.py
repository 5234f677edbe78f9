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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durable_agent.testing.http import LOOPBACK, HttpRequest, HttpResponse, LoopbackHttpService

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
    kind: str = "error"


MALFORMED = {
    "html": "a 200 whose body is an HTML page (a proxy's error page)",
    "truncated": "a 200 whose JSON body is cut off",
    "empty-message": "a completion whose message has no content and no tool calls",
    "no-choices": "a completion with an empty choices list",
    "custom-tool-call": "a completion calling a tool of type 'custom'",
}
"""What `answer_next_malformed(kind)` can send instead of a proper completion."""


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
        host: str = LOOPBACK,
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.policy = policy
        self.model = model
        self.delay_seconds: float = 0.0
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

        if fault is not None and fault.kind != "error":
            return _malformed(fault.kind, body, digest)
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(round(fault.retry_after * 1000))
            return _openai_error(
                fault.status,
                self.fail_message or f"Injected failure ({fault.status}).",
                headers=headers,
            )
        answer = self.policy(json.loads(json.dumps(body)))
        message = _normalise_message(answer, len(messages))
        completion = _completion(body, message, digest)
        with self._lock:
            self._usage.append(completion["usage"])
        return HttpResponse(200, completion)


def _malformed(kind: str, body: JsonDict, digest: str) -> HttpResponse:
    if kind == "html":
        page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        return HttpResponse(200, None, {"Content-Type": "text/html"}, raw=page)
    if kind == "truncated":
        whole = json.dumps(_completion(body, {"role": "assistant", "content": "x"}, digest))
        return HttpResponse(200, None, raw=whole[: len(whole) // 2].encode())
    if kind == "no-choices":
        return HttpResponse(200, {**_completion(body, reply(""), digest), "choices": []})
    if kind == "custom-tool-call":
        call = {"id": "call_custom", "type": "custom", "custom": {"name": "x", "input": "y"}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return HttpResponse(200, _completion(body, message, digest))
    return HttpResponse(200, _completion(body, {"role": "assistant", "content": None}, digest))


_CONTROL_PATHS = frozenset({"/_reset", "/_fail", "/_hold", "/_release", "/_delay"})


def _normalise_message(answer: Any, n_messages: int) -> JsonDict:
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
    """Build a ChatCompletion whose every byte is a function of the request. Its ``usage``
    counts about four characters a token, as OpenAI's tokenizers do for English: the
    canonical request for the prompt, the message for the completion."""
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
