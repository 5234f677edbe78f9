"""JSON encoding of journal payloads: canonical, and always storable in Postgres.

Whatever a tool or a model returns must be recorded, or a ``never`` tool that acted would
be left at ``intent``. :func:`storable` turns any value into one that JSON and Postgres
accept, and says what it had to change: NUL characters (Postgres text cannot hold them) and
unpaired surrogates become U+FFFD, floats that JSON cannot spell (NaN, infinity) and objects
it cannot encode become strings, a circular reference becomes a marker.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
from typing import Any

REPLACEMENT = "\ufffd"
MAX_DEPTH = 200
MAX_INT_DIGITS = 4000
"""Longer integers are recorded as text: Python will not write an integer of more than
4,300 digits as JSON (``sys.get_int_max_str_digits``), nor read one back."""
_MAX_INT_BITS = int(MAX_INT_DIGITS * math.log2(10))


def dumps(value: Any) -> str:
    """Canonical JSON: the same value always gives the same text (and hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def jsonb_order(value: Any) -> Any:
    """``value`` with every object's keys in the order Postgres' jsonb keeps them (shorter
    keys first, then by their UTF-8 bytes), so that a value and the same value read back
    from the journal are equal down to the order of their keys."""
    if isinstance(value, dict):
        return {k: jsonb_order(value[k]) for k in sorted(value, key=_jsonb_key)}
    if isinstance(value, list):
        return [jsonb_order(item) for item in value]
    return value


def _jsonb_key(key: str) -> tuple[int, bytes]:
    encoded = key.encode()
    return len(encoded), encoded


class ListDigest:
    """``digest(items)`` of a list that grows at its end, in time proportional to what was added.

    The canonical JSON of a list is ``[`` + its items' canonical JSON joined by ``,`` + ``]``,
    so the hash is fed item by item and finished on a copy. A list that is not the one hashed
    before plus new items (shorter, or its last hashed item replaced) is hashed from the start.
    Items are expected not to change once hashed: the agent loop only appends.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._hash = hashlib.sha256(b"[")
        self._count = 0
        self._last: object = None

    def of(self, items: list[Any]) -> str:
        if self._count > len(items) or (self._count and items[self._count - 1] is not self._last):
            self._reset()
        for index in range(self._count, len(items)):
            if index:
                self._hash.update(b",")
            self._hash.update(dumps(items[index]).encode())
        self._count = len(items)
        self._last = items[-1] if items else None
        final = self._hash.copy()
        final.update(b"]")
        return final.hexdigest()


def clean_text(text: str) -> tuple[str, list[str]]:
    """The text without what Postgres cannot store, and what was replaced."""
    problems = []
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
        problems.append("NUL characters replaced with U+FFFD")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join(REPLACEMENT if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        problems.append("unpaired surrogates replaced with U+FFFD")
    return text, problems


def storable(value: Any) -> tuple[Any, list[str]]:
    """A copy of ``value`` that canonical JSON and Postgres accept, and what was changed."""
    problems: list[str] = []
    result = _storable(value, problems, set(), 0)
    return result, sorted(set(problems))


def _storable(value: Any, problems: list[str], seen: set[int], depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value).bit_length() <= _MAX_INT_BITS else _long_int(value, problems)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        problems.append(f"non-finite number {value!r} recorded as a string")
        return repr(value)
    if isinstance(value, str):
        text, found = clean_text(value)
        problems.extend(found)
        return text
    if depth >= MAX_DEPTH:
        problems.append(f"nesting deeper than {MAX_DEPTH} levels cut off")
        return "<too deep>"
    if isinstance(value, dict | list | tuple):
        if id(value) in seen:
            problems.append("a circular reference replaced with a marker")
            return "<circular reference>"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return {
                    _key(k, problems): _storable(v, problems, seen, depth + 1)
                    for k, v in value.items()
                }
            return [_storable(v, problems, seen, depth + 1) for v in value]
        finally:
            seen.discard(id(value))
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump):
        try:
            return _storable(dump(mode="json"), problems, seen, depth + 1)
        except Exception as error:
            problems.append(f"{type(value).__name__} could not be dumped ({error})")
    problems.append(f"a {type(value).__name__} recorded as its string form")
    try:
        text = str(value)
    except Exception as error:
        text = f"<{type(value).__name__}: str() raised {type(error).__name__}>"
    cleaned, found = clean_text(text)
    problems.extend(found)
    return cleaned


def _long_int(value: int, problems: list[str]) -> str:
    """An integer too long for JSON, as text: its digits up to 100,000 of them (the decimal
    module converts without Python's limit on int-to-text conversion), else its magnitude."""
    number = decimal.Decimal(value)
    digits = number.adjusted() + 1
    problems.append(f"an integer of {digits} digits recorded as a string")
    if digits <= 100_000:
        with decimal.localcontext() as context:
            context.prec = digits + 1
            return f"{number:f}"
    return f"{number:.20e}"


def _key(key: Any, problems: list[str]) -> str:
    if isinstance(key, str):
        text, found = clean_text(key)
        problems.extend(found)
        return text
    problems.append("non-string keys recorded as strings")
    return clean_text(str(key))[0]
