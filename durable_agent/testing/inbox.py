"""A real SMTP inbox on loopback for tests, with a small Mailpit-style JSON API.

`SmtpInbox` runs an aiosmtpd SMTP server and a stdlib HTTP server, each on a free port of
127.0.0.1 in background threads, and keeps every message it receives in memory:

* SMTP: ``smtp_url`` (``smtp://127.0.0.1:PORT``), no TLS, no AUTH.
* HTTP: ``GET /messages[?to=addr]`` lists messages in arrival order, ``GET /messages/<id>``
  returns one, ``DELETE /messages`` clears them.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from types import TracebackType
from typing import Any, Self, cast

from aiosmtpd.controller import Controller

from durable_agent.testing.http import (
    LOOPBACK,
    HttpRequest,
    HttpResponse,
    LoopbackHttpService,
    RequestGate,
)

__all__ = ["InboxMessage", "SmtpInbox"]


@dataclass(frozen=True)
class InboxMessage:
    """One received message.

    `sender` and `recipients` come from the SMTP envelope (MAIL FROM / RCPT TO, so Bcc
    recipients are included); `subject` is decoded, `message_id` and `headers` (first value
    of each header name) are raw but unfolded; `body` is the text body with ``\\n`` line
    endings and no trailing newline.
    """

    id: str
    sender: str
    recipients: tuple[str, ...]
    subject: str
    body: str
    message_id: str | None
    headers: dict[str, str] = field(hash=False)
    raw: bytes = field(repr=False)

    @property
    def email(self) -> EmailMessage:
        """The message parsed with the modern `email` API."""
        return email.message_from_bytes(self.raw, policy=email.policy.default)

    def to_json(self) -> dict[str, Any]:
        """The JSON form served by the HTTP API."""
        return {
            "id": self.id,
            "from": self.sender,
            "to": list(self.recipients),
            "subject": self.subject,
            "body": self.body,
            "message_id": self.message_id,
            "headers": dict(self.headers),
        }


def _unfold(value: str) -> str:
    """Undo RFC 5322 header folding."""
    return " ".join(line.strip() for line in value.splitlines() if line.strip())


def _parse(message_id: str, sender: str, recipients: list[str], raw: bytes) -> InboxMessage:
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    part = parsed.get_body(preferencelist=("plain", "html"))
    body = part.get_content() if part is not None else ""
    headers: dict[str, str] = {}
    for name, value in parsed.raw_items():  # raw: the header parser may mangle odd values
        headers.setdefault(name, _unfold(str(value)))
    return InboxMessage(
        id=message_id,
        sender=sender,
        recipients=tuple(recipients),
        subject=str(parsed.get("Subject", "")),
        body=str(body).replace("\r\n", "\n").rstrip("\n"),
        message_id=next((v for k, v in headers.items() if k.lower() == "message-id"), None),
        headers=headers,
        raw=raw,
    )


class _SmtpHandler:
    """aiosmtpd handler that hands every accepted message to the inbox."""

    def __init__(self, inbox: SmtpInbox) -> None:
        self._inbox = inbox

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        # a held inbox keeps the sender waiting inside the SMTP transaction (off the loop)
        await asyncio.get_running_loop().run_in_executor(None, self._inbox.gate.pass_through)
        raw = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        self._inbox._deliver(str(envelope.mail_from or ""), list(envelope.rcpt_tos), raw)
        return "250 Message accepted for delivery"


class _Controller(Controller):
    """A `Controller` that can listen on port 0 (aiosmtpd would probe port 0 otherwise)."""

    def _trigger_server(self) -> None:
        if self.port == 0 and self.server is not None:
            server = cast(asyncio.Server, self.server)
            self.port = int(server.sockets[0].getsockname()[1])
        super()._trigger_server()  # type: ignore[no-untyped-call]


class _InboxApi(LoopbackHttpService):
    """The JSON API of an `SmtpInbox`."""

    def __init__(self, inbox: SmtpInbox, *, host: str, port: int) -> None:
        super().__init__(host=host, port=port)
        self._inbox = inbox

    def handle(self, request: HttpRequest) -> HttpResponse:
        path = request.path.rstrip("/")
        if path == "/messages" and request.method == "GET":
            to = request.query.get("to", [None])[0]
            return HttpResponse(200, [m.to_json() for m in self._inbox.messages_to(to)])
        if path == "/messages" and request.method == "DELETE":
            self._inbox.clear()
            return HttpResponse(200, {"deleted": True})
        if path.startswith("/messages/") and request.method == "GET":
            wanted = path.removeprefix("/messages/")
            for message in self._inbox.messages:
                if message.id == wanted:
                    return HttpResponse(200, message.to_json())
            return HttpResponse(404, {"error": f"no message with id {wanted!r}"})
        return HttpResponse(404, {"error": f"unknown route {request.method} {request.path}"})


class SmtpInbox:
    """An SMTP server plus JSON API that keeps every message it receives.

    Use as a context manager or call `start()`/`stop()`. `messages` is a list of
    `InboxMessage` in arrival order. Ports default to 0 (free ports, kept across restarts).
    """

    def __init__(self, *, host: str = LOOPBACK, smtp_port: int = 0, api_port: int = 0) -> None:
        self._host = host
        self._smtp_port = smtp_port
        self._cond = threading.Condition()
        self._messages: list[InboxMessage] = []
        self._next_id = 1
        self._controller: _Controller | None = None
        self._api = _InboxApi(self, host=host, port=api_port)
        self.gate = RequestGate()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start the SMTP server and the HTTP API; returns self."""
        if self._controller is not None:
            raise RuntimeError("SmtpInbox is already running")
        controller = _Controller(
            _SmtpHandler(self),
            hostname=self._host,
            port=self._smtp_port,
            server_hostname="localhost",  # skip socket.getfqdn(), which can be slow
            ready_timeout=10.0,
        )
        controller.start()
        self._smtp_port = int(controller.port)
        self._controller = controller
        try:
            self._api.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop both servers; idempotent. Received messages are kept."""
        self._api.stop()
        controller, self._controller = self._controller, None
        if controller is not None:
            controller.stop()

    @property
    def running(self) -> bool:
        """Whether the SMTP server is running."""
        return self._controller is not None

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
    def smtp_host(self) -> str:
        """The SMTP host (127.0.0.1)."""
        return self._host

    @property
    def smtp_port(self) -> int:
        """The SMTP port; only meaningful after `start()` when constructed with port 0."""
        if self._smtp_port == 0:
            raise RuntimeError("SmtpInbox has not been started yet")
        return self._smtp_port

    @property
    def smtp_url(self) -> str:
        """``smtp://127.0.0.1:PORT``."""
        return f"smtp://{self._host}:{self.smtp_port}"

    @property
    def api_url(self) -> str:
        """Root URL of the JSON API, ``http://127.0.0.1:PORT``."""
        return self._api.url

    # -- messages ----------------------------------------------------------------------

    def hold(self) -> None:
        """Keep every sender waiting after DATA, before the message is accepted, until
        `release()`: an email caught in the middle of its SMTP transaction."""
        self.gate.hold()

    def release(self) -> None:
        self.gate.release()

    def wait_for_waiting(self, n: int = 1, timeout: float = 10.0) -> None:
        """Return once `n` senders are held; raise TimeoutError otherwise."""
        self.gate.wait_for_waiting(n, timeout)

    def _deliver(self, sender: str, recipients: list[str], raw: bytes) -> None:
        with self._cond:
            message = _parse(str(self._next_id), sender, recipients, raw)
            self._next_id += 1
            self._messages.append(message)
            self._cond.notify_all()

    @property
    def messages(self) -> list[InboxMessage]:
        """A snapshot of every received message, in arrival order."""
        with self._cond:
            return list(self._messages)

    def messages_to(self, address: str | None) -> list[InboxMessage]:
        """Messages with `address` among the envelope recipients (all if None)."""
        if address is None:
            return self.messages
        wanted = address.strip().lower()
        return [m for m in self.messages if wanted in (r.lower() for r in m.recipients)]

    @property
    def count(self) -> int:
        """Number of messages received."""
        with self._cond:
            return len(self._messages)

    def wait_for(self, n: int = 1, timeout: float = 5.0) -> list[InboxMessage]:
        """Wait until at least `n` messages arrived and return them all.

        Raises `TimeoutError` if fewer than `n` arrive within `timeout` seconds.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._messages) >= n, timeout=timeout):
                subjects = [m.subject for m in self._messages]
                raise TimeoutError(
                    f"expected {n} message(s) in the inbox within {timeout}s, "
                    f"got {len(self._messages)}: {subjects}"
                )
            return list(self._messages)

    def clear(self) -> None:
        """Forget every received message (ids keep increasing)."""
        with self._cond:
            self._messages.clear()
