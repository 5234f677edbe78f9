"""Who is asking, and whether a POST comes from the console's own pages.

A request is authenticated by one of:

* HTTP basic auth with a login of ``DURABLE_AGENT_CONSOLE_AUTH`` (``USER:PASSWORD``, as
  Flower's ``--basic-auth``): for curl and for browsers that ask for it;
* the login form's cookie: signed with a key made when the console starts (a restart logs
  everyone out), HttpOnly, SameSite=Strict, valid for :data:`SESSION_SECONDS`;
* ``Authorization: Bearer <DURABLE_AGENT_CONSOLE_TOKEN>``: for scripts (recorded as ``token``);
* nobody, with ``--insecure-no-auth`` on a loopback address (recorded as ``anonymous``).

Every action is recorded with the user's name (``by``), as the CLI records ``--by``.

A POST from a browser must carry the form's CSRF token (an HMAC of the session, or of the
basic-auth user, under the console's key) and an ``Origin`` (or, when a browser sends none,
a ``Referer``) of this very host. A bearer-token request needs neither: a browser never adds
that header on its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "durable_agent_console"
SESSION_SECONDS = 12 * 3600
TOKEN_USER = "token"
ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Identity:
    """The user behind a request: ``user`` for ``by``, ``how`` they proved it, and the
    session the CSRF token is bound to."""

    user: str
    how: str  # "basic", "session", "token" or "none"
    session: str = ""


class Authenticator:
    """The console's logins and its signing key (made at start, never stored)."""

    def __init__(
        self, logins: dict[str, str], token: str = "", *, allow_anonymous: bool = False
    ) -> None:
        self._logins = dict(logins)
        self._token = token
        self.allow_anonymous = allow_anonymous
        self._key = secrets.token_bytes(32)

    @property
    def has_logins(self) -> bool:
        return bool(self._logins)

    def check_password(self, user: str, password: str) -> bool:
        expected = self._logins.get(user)
        # compare something of the same kind either way, so an unknown user takes as long
        candidate = expected if expected is not None else secrets.token_hex(16)
        matched = hmac.compare_digest(candidate.encode(), password.encode())
        return expected is not None and matched

    def identify(self, request: Request) -> Identity | None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic":
            return self._basic(value.strip())
        if scheme.lower() == "bearer":
            token = value.strip()
            if self._token and hmac.compare_digest(token.encode(), self._token.encode()):
                return Identity(TOKEN_USER, "token")
            return None
        session = self.read_session(request.cookies.get(SESSION_COOKIE, ""))
        if session is not None:
            return session
        if self.allow_anonymous:
            return Identity(ANONYMOUS, "none")
        return None

    def _basic(self, value: str) -> Identity | None:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, colon, password = decoded.partition(":")
        if colon and self.check_password(user, password):
            return Identity(user, "basic")
        return None

    # -- the login form's cookie ----------------------------------------------------------

    def new_session(self, user: str) -> str:
        """The cookie's value: user, a random session id, its expiry, and their HMAC."""
        expires = int(time.time()) + SESSION_SECONDS
        payload = f"{_b64(user)}.{secrets.token_urlsafe(16)}.{expires}"
        return f"{payload}.{self._sign('session', payload)}"

    def read_session(self, cookie: str) -> Identity | None:
        parts = cookie.split(".")
        if len(parts) != 4:
            return None
        payload, signature = ".".join(parts[:3]), parts[3]
        if not hmac.compare_digest(signature, self._sign("session", payload)):
            return None
        try:
            user = base64.urlsafe_b64decode(parts[0] + "==").decode()
            expires = int(parts[2])
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        if expires < time.time() or user not in self._logins:
            return None
        return Identity(user, "session", session=parts[1])

    # -- cross-site request checks --------------------------------------------------------

    def csrf_token(self, identity: Identity) -> str:
        """The token every form of this user's pages carries."""
        return self._sign("csrf", f"{identity.how}:{identity.user}:{identity.session}")

    def csrf_problem(self, request: Request, identity: Identity | None, sent: str) -> str | None:
        """Why this POST is refused as possibly cross-site (None: it is not)."""
        if identity is not None and identity.how == "token":
            return None
        problem = same_origin_problem(request)
        if problem is not None:
            return problem
        if identity is None:  # the login form: no session yet, the origin check is it
            return None
        if not sent or not hmac.compare_digest(sent, self.csrf_token(identity)):
            return "the form's CSRF token is missing or stale: reload the page and try again"
        return None

    def _sign(self, purpose: str, text: str) -> str:
        mac = hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).digest()
        return _b64(mac)


def same_origin_problem(request: Request) -> str | None:
    """None when the request's Origin (else Referer) names the host it was sent to."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        if origin == "null":
            return "a POST from an opaque origin is refused"
        where = urlsplit(origin).netloc
    else:
        referer = request.headers.get("referer")
        if not referer:
            return "a POST needs an Origin or Referer header of this console"
        where = urlsplit(referer).netloc
    if not host or where != host:
        return f"a POST from another site ({where or 'unknown'}) is refused"
    return None


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
