"""Checks of what callers hand in: ids and messages, with their documented limits.

A turn id or a session id is 1 to 200 characters with no control characters; a user's
message is text of at most ``DURABLE_AGENT_MAX_MESSAGE_BYTES`` (UTF-8, default 256 KiB) with
no NUL. Each check raises :class:`~durable_agent.errors.InvalidArgument` saying what is wrong,
before anything is written or sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument

MAX_ID_LENGTH = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_id(name: str, value: Any) -> str:
    """An id given by a caller (``turn_id``, ``session_id``), or InvalidArgument."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{name} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(
            f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed"
        )
    found = _CONTROL.search(value)
    if found:
        raise InvalidArgument(f"{name} contains a control character ({found.group()!r})")
    _check_encodable(name, value)
    return value


def check_message(value: Any, max_bytes: int) -> str:
    """A user's message, or InvalidArgument."""
    if not isinstance(value, str):
        raise InvalidArgument(f"message must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument("message must not be empty")
    if "\x00" in value:
        raise InvalidArgument("message contains a NUL character, which cannot be stored")
    size = len(_check_encodable("message", value))
    if size > max_bytes:
        raise InvalidArgument(
            f"message is {size} bytes; at most {max_bytes} are allowed "
            "(DURABLE_AGENT_MAX_MESSAGE_BYTES)"
        )
    return value


def check_timeout(value: Any) -> float:
    """A timeout in seconds: a finite number, zero or more."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"timeout must be a number of seconds, not {type(value).__name__}")
    if not value >= 0 or value == float("inf"):  # NaN fails the first test
        raise InvalidArgument(f"timeout must be a finite number of seconds >= 0, not {value}")
    return float(value)


def check_count(name: str, value: Any, high: int) -> int:
    """A whole number from 1 to ``high`` (a limit, a batch size), or InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidArgument(f"{name} must be a whole number from 1 to {high}")
    return value


def _check_encodable(name: str, value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{name} is not valid text (it holds a lone surrogate)") from None


@dataclass(frozen=True)
class Limit:
    """A model's requests and tokens a minute (None: not limited)."""

    rpm: int | None = None
    tpm: int | None = None


def parse_limits(text: str) -> dict[str, Limit]:
    """``MODEL=rpm:N/tpm:N, ...`` as limits by model name; ValueError with the bad item."""
    limits: dict[str, Limit] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        model, sep, spec = item.partition("=")
        values: dict[str, int] = {}
        for rule in spec.split("/") if sep else []:
            name, _, number = rule.strip().partition(":")
            if name not in ("rpm", "tpm") or not number.strip().isdigit() or int(number) < 1:
                values = {}
                break
            values[name] = int(number)
        if not model.strip() or not values:
            raise ValueError(
                f"not a limit: {item!r} (MODEL=rpm:N/tpm:N, either or both, whole numbers >= 1)"
            )
        limits[model.strip()] = Limit(values.get("rpm"), values.get("tpm"))
    return limits
