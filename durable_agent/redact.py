"""Text that is stored, logged or printed: credentials out, control characters escaped."""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from collections.abc import Iterable

_PATTERNS = [
    # Authorization headers echoed back: "Bearer <token>", "Basic <base64>"
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{6,}", re.I), r"\1 ***"),
    # OpenAI-style keys anywhere: sk-..., sk-proj-..., rk-...
    (re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{6,}"), r"\1-***"),
    # a password in a URL: scheme://user:password@host
    (re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]+@", re.I), r"\1:***@"),
    # key=value or "key": "value" for the usual names
    (
        re.compile(
            r"((?:api[_-]?key|apikey|access[_-]?token|secret|password|passwd|token)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+",
            re.I,
        ),
        r"\1***",
    ),
]


SHORTEST_SECRET = 8
"""Configured secrets shorter than this are left to the patterns (a 3-letter password
would blank out every word that holds it)."""

_secrets: tuple[str, ...] = ()  # longest first
_secrets_lock = threading.Lock()


def remember_secrets(values: Iterable[str | None]) -> None:
    """Redact these configured secrets (an API key, a password) wherever they appear, as
    written and in URL-encoded form, in this process from now on. Settings calls it with
    its own secrets when it is read."""
    global _secrets
    forms: set[str] = set()
    for value in values:
        if not value:
            continue
        for form in (
            value,
            urllib.parse.unquote(value),
            urllib.parse.quote(value, safe=""),
            urllib.parse.quote_plus(value, safe=""),
        ):
            if len(form) >= SHORTEST_SECRET:
                forms.add(form)
    with _secrets_lock:
        if forms - set(_secrets):
            _secrets = tuple(sorted(forms | set(_secrets), key=len, reverse=True))


def forget_secrets() -> None:
    """Forget every remembered secret (for tests)."""
    global _secrets
    with _secrets_lock:
        _secrets = ()


def url_password(url: str | None) -> str | None:
    """The password of ``scheme://user:password@host`` (as written), or None."""
    if not url:
        return None
    try:
        return urllib.parse.urlsplit(url).password
    except ValueError:
        return None


def redact(text: str) -> str:
    """The text with the configured secrets (:func:`remember_secrets`) and anything that
    looks like a credential replaced by ``***``."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "***")
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """The text safe to print on a terminal: control characters (an ANSI escape from a
    model's reply, a bell, a carriage return) are shown as ``\\x1b`` and the like; line
    breaks and tabs are kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_LINE_BREAKS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _LINE_BREAKS:
        return _LINE_BREAKS[char]
    return f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}"


def one_line(text: str) -> str:
    """The text as one line: every control character escaped, line breaks too (``\\n``),
    so that text from outside (a model's reply, a tool's output, an error body) cannot
    start a line of its own in a log or on a terminal."""
    return _ANY_CONTROL.sub(_escaped, text)


class OneLineLogFilter(logging.Filter):
    """A handler filter: each log record is one line with no credential in it.

    The message (with its arguments filled in) is redacted and its control characters
    escaped, so that a model's reply, a tool's output or an error body that holds a newline
    or an escape sequence cannot write a line of its own (``ERROR ... turn X failed``) or
    recolour a terminal. The worker puts it on Celery's handlers, the command line on its
    own; add it to yours with :func:`escape_log_lines`.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it where it formats
            return True
        safe = one_line(redact(message))
        if safe != message:
            record.msg, record.args = safe, None
        return True


def escape_log_lines(handlers: Iterable[logging.Handler]) -> None:
    """Put a :class:`OneLineLogFilter` on each handler (once)."""
    for handler in handlers:
        if not any(isinstance(f, OneLineLogFilter) for f in handler.filters):
            handler.addFilter(OneLineLogFilter())
