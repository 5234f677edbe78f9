"""Text that is stored, logged or printed: credentials out, control characters escaped."""

from __future__ import annotations

import re

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


def redact(text: str) -> str:
    """The text with anything that looks like a credential replaced by ``***``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """The text safe to print on a terminal: control characters (an ANSI escape from a
    model's reply, a bell, a carriage return) are shown as ``\\x1b`` and the like; line
    breaks and tabs are kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
