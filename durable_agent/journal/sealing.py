"""Payloads sealed at rest: AES-GCM under a keyring, each bound to the row it belongs to.

One seam. Writers seal what they store (:meth:`Sealer.text` for a text column,
:meth:`Sealer.json` for a jsonb one, :meth:`Sealer.blob` for a large payload); every row a
named query returns is opened on its way out of :mod:`.db`, by its column names
(:data:`SEALED_COLUMNS`), so every reader (the runner, the CLI, the console, stream and
replay) gets clear values without knowing that they were sealed.

A sealed value says which key sealed it and carries a random 96-bit nonce; its associated
data is where it lives (turn, step, field; a blob's id), so a ciphertext copied into another
row does not open. A text column holds ``MARK + token``; a jsonb column holds
``{"$": token}`` plus clear copies of the few keys SQL filters and counts on
(:data:`CLEAR_KEYS`: a model step's model, its token usage, the ``uncertain`` flag). A value
without the mark is clear: rows written before a key was configured read as they are, and
``durable-agent rekey`` seals them.

Without a keyring nothing is sealed and nothing is paid but a prefix test per opened column.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigurationError, KeyUnavailable, PayloadTampered

MARK = "\x1fsealed:"
"""The start of a sealed text value (a unit separator then ``sealed:``)."""
SEALED_KEY = "$"
"""The key of a sealed jsonb value's token: one character, so that jsonb (which orders an
object's keys by length first) always writes it first and a reader can find the token
without parsing the object (:class:`SealedJson`)."""
_SEALED_START = b'{"$": "'  # how Postgres writes a sealed jsonb value out
KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_NONCE = 12
_AAD_PREFIX = b"durable-agent/1\x00"


class Column(NamedTuple):
    """How a result column that may hold a sealed value is opened."""

    json: bool  # a jsonb column (else text)
    per_step: bool  # bound to (turn, step, field) (else to (turn, field))
    key: str | None = None  # a column of the row bound too (e.g. an event's event_id)


SEALED_COLUMNS: dict[str, Column] = {
    "message": Column(json=False, per_step=False),
    "reply": Column(json=False, per_step=False),
    "input": Column(json=True, per_step=True),
    "output": Column(json=True, per_step=True),
    "arguments": Column(json=True, per_step=True),
    "payload": Column(json=True, per_step=False, key="event_id"),
}
"""Result columns opened wherever a query returns them (a row with one of them names its
``turn_id``, and ``step`` for a per-step one; ``output`` with a ``blob`` came from blobs).
A query that must see the stored form aliases the column (``input AS stored_input``).
A new payload column is one entry here and one call where it is written, as an event's
``payload`` is: ``Column(json=True, per_step=False, key="event_id")`` here and
``sealer.json(payload, Where(turn_id, "payload", key=event_id))`` in its store
(``wait_store.py``)."""

CLEAR_KEYS: dict[str, tuple[str, ...]] = {
    "input": ("model",),
    "output": ("usage", "uncertain"),
    "data": ("usage", "uncertain"),  # an output large enough to go to blobs
}
"""Top-level keys of a sealed jsonb value kept clear beside the token: what SQL reads
(the spend ledger's model and token counts, the uncertain-effects inbox's flag)."""


@runtime_checkable
class KeyProvider(Protocol):
    """Where keys come from (a KMS, a vault): 32-byte AES keys by key id.

    ``newest()`` names the key new writes use; ``key(key_id)`` gives a key's bytes, or
    None for a key it does not hold (retired, unknown). Called once per key id per process:
    the keyring keeps what it was given.
    """

    def newest(self) -> str: ...

    def key(self, key_id: str) -> bytes | None: ...


@dataclass(frozen=True)
class StaticKeys:
    """Keys given as text: ``k2:<base64 of 32 bytes>,k1:<...>``, newest first
    (``DURABLE_AGENT_KEYS``)."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def parse(cls, text: str) -> StaticKeys:
        keys: list[tuple[str, bytes]] = []
        for entry in (part.strip() for part in text.split(",")):
            if not entry:
                continue
            key_id, colon, encoded = entry.partition(":")
            key_id = key_id.strip()
            if not colon or not KEY_ID.match(key_id):
                raise ConfigurationError(
                    "DURABLE_AGENT_KEYS: each entry is <key id>:<base64 of 32 bytes>, the key "
                    "id 1 to 32 letters, digits, '-' or '_' (newest first, comma-separated)"
                )
            try:
                raw = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError(
                    f"DURABLE_AGENT_KEYS: key {key_id!r} is not valid base64"
                ) from None
            if len(raw) != 32:
                raise ConfigurationError(
                    f"DURABLE_AGENT_KEYS: key {key_id!r} is {len(raw)} bytes; AES-256 needs 32"
                )
            if any(key_id == known for known, _ in keys):
                raise ConfigurationError(f"DURABLE_AGENT_KEYS: key id {key_id!r} is given twice")
            keys.append((key_id, raw))
        return cls(tuple(keys))

    def newest(self) -> str:
        return self.keys[0][0]

    def key(self, key_id: str) -> bytes | None:
        return next((raw for known, raw in self.keys if known == key_id), None)

    def ids(self) -> list[str]:
        return [key_id for key_id, _ in self.keys]


def new_key() -> str:
    """A fresh key for ``DURABLE_AGENT_KEYS``, as base64."""
    return base64.b64encode(os.urandom(32)).decode()


class SealedJson(str):
    """A sealed jsonb value as our connections read it: its token, not parsed (``stored``:
    the value as Postgres wrote it). :meth:`Sealer.open_json` opens it like the parsed
    form ``{"$": token, ...}`` that other connections give."""

    stored: str

    def __new__(cls, token: str, stored: str) -> SealedJson:
        value = super().__new__(cls, token)
        value.stored = stored
        return value


def load_jsonb(data: str | bytes) -> Any:
    """jsonb as text from Postgres: a sealed value's token without parsing it, else JSON."""
    if isinstance(data, bytes) and data.startswith(_SEALED_START):
        end = data.find(b'"', len(_SEALED_START))
        return SealedJson(data[len(_SEALED_START) : end].decode(), data.decode())
    return json.loads(data)


class Where(NamedTuple):
    """The row a value belongs to: its associated data."""

    turn_id: str
    field: str
    step: int | None = None
    blob: str | None = None
    key: str | None = None  # another id of the row (an event's), bound too

    def aad(self) -> bytes:
        if self.blob is not None:
            return _AAD_PREFIX + f"blob\x00{self.blob}".encode()
        step = "" if self.step is None else str(self.step)
        aad = f"{self.turn_id}\x00{step}\x00{self.field}"
        return _AAD_PREFIX + (aad if self.key is None else f"{aad}\x00{self.key}").encode()

    def describe(self) -> str:
        if self.blob is not None:
            return f"blob {self.blob[:12]}"
        step = "" if self.step is None else f" step {self.step}"
        key = "" if self.key is None else f" ({self.key})"
        return f"turn {self.turn_id}{step} {self.field}{key}"


class Sealer:
    """Seals payloads under the keyring's newest key and opens them under any key it holds.

    ``Sealer(None)`` seals nothing and opens nothing: a sealed value it meets is an error
    naming the key it needs.
    """

    def __init__(self, provider: KeyProvider | None = None) -> None:
        self.provider = provider
        self._ciphers: dict[str, Any] = {}
        self.newest: str | None = None
        self._blob_ids: bytes | None = None
        if provider is not None:
            self.newest = provider.newest()
            if not KEY_ID.match(self.newest or ""):
                raise ConfigurationError(
                    f"the key provider's newest key id {self.newest!r} is not valid"
                )
            self._cipher(self.newest, None)  # the newest key must be there now
            raw = provider.key(self.newest)
            assert raw is not None
            self._blob_ids = hmac.new(raw, b"durable-agent blob ids", hashlib.sha256).digest()

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    # -- writing --------------------------------------------------------------------------

    def text(self, value: str, where: Where) -> str:
        """What a text column stores for ``value``."""
        if self.newest is None:
            return value
        return MARK + self._token(value.encode(), where)

    def json(self, value: Any, where: Where, encoded: str | None = None) -> str:
        """The JSON text a jsonb column stores for ``value`` (``encoded``: its canonical
        JSON, when the caller has it already)."""
        if encoded is None:
            from .codec import dumps

            encoded = dumps(value)
        if self.newest is None:
            return encoded
        # the token is a key id and base64: nothing in it needs escaping
        sealed = '{"' + SEALED_KEY + '":"' + self._token(encoded.encode(), where) + '"'
        if type(value) is dict:
            for key in CLEAR_KEYS.get(where.field, ()):
                if key in value:
                    sealed += ',"' + key + '":' + json.dumps(value[key], ensure_ascii=False)
        return sealed + "}"

    def blob_id(self, encoded: str) -> str:
        """The id of a blob holding ``encoded``: its sha256, keyed when sealing (a plain hash
        of a payload would let anyone holding a guess confirm it)."""
        if self._blob_ids is None:
            return hashlib.sha256(encoded.encode()).hexdigest()
        return hmac.new(self._blob_ids, encoded.encode(), hashlib.sha256).hexdigest()

    def _token(self, plain: bytes, where: Where) -> str:
        assert self.newest is not None
        nonce = os.urandom(_NONCE)
        sealed = self._cipher(self.newest, where).encrypt(nonce, plain, where.aad())
        return self.newest + ":" + binascii.b2a_base64(nonce + sealed, newline=False).decode()

    # -- reading --------------------------------------------------------------------------

    def open_text(self, stored: str, where: Where) -> str:
        if not stored.startswith(MARK):
            return stored
        return self._open(stored[len(MARK) :], where).decode()

    def open_json(self, stored: Any, where: Where) -> Any:
        if type(stored) is SealedJson:
            return json.loads(self._open(stored, where).decode())
        if not (type(stored) is dict and SEALED_KEY in stored):
            return stored
        return json.loads(self._open(stored[SEALED_KEY], where).decode())

    def key_of(self, stored: Any) -> str | None:
        """The id of the key that sealed a stored value (None: clear)."""
        if type(stored) is SealedJson:
            token = str(stored)
        elif type(stored) is str and stored.startswith(MARK):
            token = stored[len(MARK) :]
        elif type(stored) is dict and isinstance(stored.get(SEALED_KEY), str):
            token = stored[SEALED_KEY]
        else:
            return None
        return token.partition(":")[0]

    def _open(self, token: str, where: Where) -> bytes:
        key_id, _, encoded = token.partition(":")
        cipher = self._cipher(key_id, where)
        try:
            raw = binascii.a2b_base64(encoded, strict_mode=True)
            return bytes(cipher.decrypt(raw[:_NONCE], raw[_NONCE:], where.aad()))
        except Exception as error:  # InvalidTag, bad base64, too short
            raise PayloadTampered(
                f"{where.describe()}: the value sealed with key {key_id!r} does not open "
                f"({type(error).__name__}): it was altered or copied from another row"
            ) from None

    def _cipher(self, key_id: str, where: Where | None) -> Any:
        cipher = self._ciphers.get(key_id)
        if cipher is not None:
            return cipher
        raw = self.provider.key(key_id) if self.provider is not None else None
        if raw is None:
            place = f"{where.describe()} is sealed with key {key_id!r}, " if where else ""
            held = "no keys are configured (DURABLE_AGENT_KEYS)"
            if isinstance(self.provider, StaticKeys):
                held = f"DURABLE_AGENT_KEYS holds {', '.join(self.provider.ids())}"
            elif self.provider is not None:
                held = "the key provider does not hold it"
            raise KeyUnavailable(
                f"{place or f'key {key_id!r}: '}which is unknown or retired: {held}"
            )
        if len(raw) != 32:
            raise ConfigurationError(f"key {key_id!r} is {len(raw)} bytes; AES-256 needs 32")
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise ConfigurationError(
                "encryption needs the cryptography package: pip install 'durable-agent[encryption]'"
            ) from None
        cipher = self._ciphers[key_id] = AESGCM(raw)
        return cipher

    # -- rows -----------------------------------------------------------------------------

    def open_rows(
        self, query: str, names: Sequence[str], rows: list[Any], *, mark: bool = False
    ) -> None:
        """Open in place the sealed values of ``rows`` (dicts, or tuples in ``names`` order;
        a tuple that holds one is replaced by a list). ``mark`` (dict rows): a value that
        does not open (a key this process lacks, a tampered value) becomes None and is
        listed under the row's :data:`UNREADABLE` key, instead of failing every row."""
        columns = [
            (index, name, SEALED_COLUMNS[name])
            for index, name in enumerate(names)
            if name in SEALED_COLUMNS
        ]
        if not columns or not rows:
            return
        keyed = isinstance(rows[0], dict)
        places = {*_PLACE, *(column.key for _, _, column in columns if column.key)}
        at = {field: (field if keyed else names.index(field)) for field in places if field in names}
        for number, row in enumerate(rows):
            for index, name, column in columns:
                value = row[name] if keyed else row[index]
                if column.json:
                    if type(value) is not SealedJson and not (
                        type(value) is dict and SEALED_KEY in value
                    ):
                        continue
                elif not (type(value) is str and value.startswith(MARK)):
                    continue
                where = _where(query, row, at, name, column)
                try:
                    if column.json:
                        opened = self.open_json(value, where)
                    else:
                        opened = self.open_text(value, where)
                except (KeyUnavailable, PayloadTampered) as error:
                    if not (mark and keyed):
                        raise
                    opened = None
                    marks = row.setdefault(UNREADABLE, [])
                    marks.append(unreadable_of(error, name, self.key_of(value) or ""))
                if keyed:
                    row[name] = opened
                else:
                    if type(row) is tuple:
                        row = rows[number] = list(row)
                    row[index] = opened


_PLACE = ("turn_id", "step", "blob")


def _where(query: str, row: Any, at: dict[str, Any], name: str, column: Column) -> Where:
    turn_id = row[at["turn_id"]] if "turn_id" in at else None
    if turn_id is None:
        raise ConfigurationError(f"query {query} returns a sealed {name} without its turn_id")
    if name == "output" and "blob" in at and row[at["blob"]]:
        return Where(turn_id, "data", blob=row[at["blob"]])
    key = None
    if column.key is not None:
        key = row[at[column.key]] if column.key in at else None
        if key is None:
            raise ConfigurationError(
                f"query {query} returns a sealed {name} without its {column.key}"
            )
    if not column.per_step:
        return Where(turn_id, name, key=key)
    step = row[at["step"]] if "step" in at else None
    if step is None:
        raise ConfigurationError(f"query {query} returns a sealed {name} without its step")
    return Where(turn_id, name, step, key=key)


NO_SEALING = Sealer(None)

UNREADABLE = "unreadable"
"""The key under which a marked read (:meth:`Sealer.open_rows` with ``mark=True``) lists
the values of a row that did not open (:class:`Unreadable`)."""


class Unreadable(NamedTuple):
    """A stored value that did not open, as a marked read reports it instead of raising:
    its field, why (``key_unavailable``: sealed with a key this process does not hold;
    ``tampered``: it does not open under its key, altered or copied from another row), the
    key it names, and the error's text (which names the row)."""

    field: str
    reason: Literal["key_unavailable", "tampered"]
    key: str
    detail: str

    @property
    def label(self) -> str:
        """What a listing shows in place of the value."""
        if self.reason == "key_unavailable":
            return f"[sealed: key {self.key} unavailable]"
        return "[does not open: tampered]"

    def as_json(self) -> dict[str, str]:
        return {"reason": self.reason, "key": self.key, "detail": self.detail}


def unreadable_of(error: KeyUnavailable | PayloadTampered, field: str, key: str) -> Unreadable:
    """The mark of a value that raised ``error`` when opened."""
    reason: Literal["key_unavailable", "tampered"] = (
        "key_unavailable" if isinstance(error, KeyUnavailable) else "tampered"
    )
    return Unreadable(field, reason, key, str(error))


def load_provider(path: str) -> KeyProvider:
    """The key provider at ``module:callable`` (called with no arguments)."""
    module_name, colon, attribute = path.partition(":")
    if not colon:
        raise ConfigurationError(
            f"DURABLE_AGENT_KEY_PROVIDER must be module:callable, not {path!r}"
        )
    try:
        factory: Callable[[], Any] = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigurationError(f"DURABLE_AGENT_KEY_PROVIDER {path!r}: {error}") from None
    provider = factory()
    if not isinstance(provider, KeyProvider):
        raise ConfigurationError(
            f"DURABLE_AGENT_KEY_PROVIDER {path!r} gave a {type(provider).__name__}, which has "
            "no newest() and key(key_id)"
        )
    return provider


def sealer_for(keys: str, provider: str = "") -> Sealer:
    """The sealer of these settings (``DURABLE_AGENT_KEYS``, ``DURABLE_AGENT_KEY_PROVIDER``)."""
    if keys.strip() and provider:
        raise ConfigurationError("set DURABLE_AGENT_KEYS or DURABLE_AGENT_KEY_PROVIDER, not both")
    if provider:
        return Sealer(load_provider(provider))
    static = StaticKeys.parse(keys)
    return Sealer(static) if static.keys else NO_SEALING


def key_ids(stored: Iterable[Any]) -> set[str | None]:
    """The keys that sealed these stored values (None for a clear one)."""
    return {NO_SEALING.key_of(value) for value in stored}
