"""Sealing payloads (no database): the keyring's format, what a sealed value binds to, the
clear copies SQL reads, rows opened by column name, and the errors a wrong key gives."""

from __future__ import annotations

import base64
import json
import sys
import types

import pytest

from durable_agent.errors import ConfigurationError, KeyUnavailable, PayloadTampered
from durable_agent.journal import (
    MARK,
    NO_SEALING,
    SEALED_KEY,
    Sealer,
    StaticKeys,
    Where,
    dumps,
    new_key,
    sealer_for,
)
from durable_agent.redact import redact
from durable_agent.settings import Settings

K1, K2 = new_key(), new_key()


def test_keys_are_parsed_newest_first_and_checked() -> None:
    keys = StaticKeys.parse(f" k2:{K2} , k1:{K1} ")
    assert keys.ids() == ["k2", "k1"] and keys.newest() == "k2"
    assert keys.key("k1") == base64.b64decode(K1) and keys.key("k0") is None
    short = base64.b64encode(b"x" * 16).decode()
    for bad, says in [
        ("k1", "each entry is"),
        (f"bad id:{K1}", "each entry is"),
        ("k1:not base64!", "not valid base64"),
        (f"k1:{short}", "16 bytes; AES-256 needs 32"),
        (f"k1:{K1},k1:{K2}", "given twice"),
    ]:
        with pytest.raises(ConfigurationError, match=says):
            StaticKeys.parse(bad)


def test_a_bad_key_setting_is_one_line_and_the_keys_are_secrets() -> None:
    with pytest.raises(ConfigurationError, match="DURABLE_AGENT_KEYS"):
        from durable_agent.settings import settings_error

        try:
            Settings(keys="k1:nope")
        except Exception as error:
            raise settings_error(error) from None  # type: ignore[arg-type]
    settings = Settings(keys=f"k1:{K1}")
    assert K1 in settings.secrets()
    assert K1 not in redact(f"the key was {K1} here")
    assert K1 not in repr(settings)


def test_sealed_values_open_only_where_they_were_sealed() -> None:
    sealer = Sealer(StaticKeys.parse(f"k1:{K1}"))
    here = Where("turn-1", "input", 3)
    stored = json.loads(sealer.json({"to": "ada@example.com", "model": "m"}, here))
    assert "ada@example.com" not in json.dumps(stored)
    assert stored["model"] == "m" and stored[SEALED_KEY].startswith("k1:")
    assert sealer.open_json(stored, here) == {"to": "ada@example.com", "model": "m"}
    for elsewhere in (
        Where("turn-2", "input", 3),
        Where("turn-1", "input", 4),
        Where("turn-1", "output", 3),
    ):
        with pytest.raises(PayloadTampered, match="does not open"):
            sealer.open_json(stored, elsewhere)
    text = sealer.text("hello", Where("turn-1", "message"))
    assert text.startswith(MARK + "k1:") and "hello" not in text
    assert sealer.open_text(text, Where("turn-1", "message")) == "hello"
    altered = text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB")
    with pytest.raises(PayloadTampered):
        sealer.open_text(altered, Where("turn-1", "message"))
    # every seal has its own nonce
    assert sealer.text("hello", Where("turn-1", "message")) != text


def test_output_keeps_usage_and_the_uncertain_flag_clear() -> None:
    sealer = Sealer(StaticKeys.parse(f"k1:{K1}"))
    value = {"usage": {"prompt_tokens": 3}, "uncertain": True, "content": "secret"}
    stored = json.loads(sealer.json(value, Where("t", "output", 0), dumps(value)))
    assert set(stored) == {SEALED_KEY, "usage", "uncertain"}
    blob = json.loads(sealer.json(value, Where("t", "data", blob="b1")))
    assert set(blob) == {SEALED_KEY, "usage", "uncertain"}  # the spend ledger reads blobs too


def test_a_retired_or_missing_key_is_named() -> None:
    stored = Sealer(StaticKeys.parse(f"k1:{K1}")).text("hi", Where("t", "reply"))
    with pytest.raises(KeyUnavailable, match=r"turn t reply is sealed with key 'k1'.*holds k2"):
        Sealer(StaticKeys.parse(f"k2:{K2}")).open_text(stored, Where("t", "reply"))
    with pytest.raises(KeyUnavailable, match="no keys are configured"):
        NO_SEALING.open_text(stored, Where("t", "reply"))


def test_rows_are_opened_by_column_name_dicts_and_tuples() -> None:
    sealer = Sealer(StaticKeys.parse(f"k2:{K2},k1:{K1}"))
    old = Sealer(StaticKeys.parse(f"k1:{K1}"))
    message = old.text("hi", Where("t", "message"))
    payload = json.loads(sealer.json({"a": 1}, Where("t", "input", 2)))
    blob = json.loads(sealer.json([1, 2], Where("t", "data", blob="abc")))
    rows: list[dict[str, object]] = [
        {
            "turn_id": "t",
            "step": 2,
            "message": message,
            "input": payload,
            "output": None,
            "stored_input": payload,
        }
    ]
    sealer.open_rows("q", list(rows[0]), rows)
    assert rows[0]["message"] == "hi" and rows[0]["input"] == {"a": 1}
    assert rows[0]["stored_input"] == payload  # an aliased column is left as stored
    tuples: list[object] = [("t", 0, blob, "abc")]
    sealer.open_rows("q", ["turn_id", "step", "output", "blob"], tuples)
    assert tuples == [["t", 0, [1, 2], "abc"]]
    clear: list[object] = [("t", 0, {"a": 1}, None)]
    sealer.open_rows("q", ["turn_id", "step", "output", "blob"], clear)
    assert clear == [("t", 0, {"a": 1}, None)]  # clear rows are left as they are
    with pytest.raises(ConfigurationError, match="query q returns a sealed message without"):
        sealer.open_rows("q", ["message"], [{"message": message}])


def test_a_marked_read_marks_what_does_not_open_and_opens_the_rest() -> None:
    """Listings read marked: a value under a key this process lacks, or moved from its row,
    is None with the reason, key and error; the other values and rows open as usual."""
    k1 = Sealer(StaticKeys.parse(f"k1:{K1}"))
    k2 = Sealer(StaticKeys.parse(f"k2:{K2}"))
    moved_value = k2.text("moved", Where("a", "message"))  # a's message, in c's row
    rows: list[dict[str, object]] = [
        {"turn_id": "a", "message": k2.text("mine", Where("a", "message")), "reply": None},
        {"turn_id": "b", "message": k1.text("old key", Where("b", "message")), "reply": None},
        {"turn_id": "c", "message": moved_value, "reply": "clear"},
    ]
    k2.open_rows("q", ["turn_id", "message", "reply"], rows, mark=True)

    assert rows[0] == {"turn_id": "a", "message": "mine", "reply": None}
    assert rows[1]["message"] is None and rows[2]["message"] is None
    assert rows[2]["reply"] == "clear"
    (missing,) = rows[1]["unreadable"]  # type: ignore[misc]
    assert (missing.field, missing.reason, missing.key) == ("message", "key_unavailable", "k1")
    assert missing.label == "[sealed: key k1 unavailable]" and "turn b message" in missing.detail
    (moved,) = rows[2]["unreadable"]  # type: ignore[misc]
    assert (moved.reason, moved.label) == ("tampered", "[does not open: tampered]")
    assert "turn c message" in moved.detail
    with pytest.raises(PayloadTampered):  # unmarked, as the worker's journal reads
        k2.open_rows("q", ["turn_id", "message"], [{"turn_id": "c", "message": moved_value}])
    tuples: list[object] = [("b", k1.text("old key", Where("b", "message")))]
    with pytest.raises(KeyUnavailable):  # only dict rows are marked
        k2.open_rows("q", ["turn_id", "message"], tuples, mark=True)


def test_no_key_seals_nothing() -> None:
    assert sealer_for("") is NO_SEALING
    assert NO_SEALING.text("hi", Where("t", "message")) == "hi"
    assert NO_SEALING.json({"a": 1}, Where("t", "input", 0)) == '{"a":1}'


def test_a_key_provider_is_loaded_from_a_module(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = base64.b64decode(K1)

    class Vault:
        def newest(self) -> str:
            return "kms-1"

        def key(self, key_id: str) -> bytes | None:
            return raw if key_id == "kms-1" else None

    module = types.ModuleType("my_vault")
    module.provider = Vault  # type: ignore[attr-defined]
    module.nothing = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_vault", module)
    sealer = sealer_for("", "my_vault:provider")
    assert sealer.newest == "kms-1"
    stored = sealer.text("hi", Where("t", "message"))
    assert stored.startswith(MARK + "kms-1:")
    with pytest.raises(ConfigurationError, match="no newest"):
        sealer_for("", "my_vault:nothing")
    with pytest.raises(ConfigurationError, match="not both"):
        sealer_for(f"k1:{K1}", "my_vault:provider")


def test_a_new_payload_column_binds_its_own_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """How another table's payload joins the seam (an event's, say): one entry in
    SEALED_COLUMNS naming the id it is bound to, one call where it is written."""
    from durable_agent.journal import sealing

    monkeypatch.setitem(
        sealing.SEALED_COLUMNS, "payload", sealing.Column(json=True, per_step=False, key="event_id")
    )
    sealer = Sealer(StaticKeys.parse(f"k1:{K1}"))
    stored = json.loads(sealer.json({"paid": 12}, Where("t", "payload", key="e-1")))
    rows: list[dict[str, object]] = [{"turn_id": "t", "event_id": "e-1", "payload": stored}]
    sealer.open_rows("events", list(rows[0]), rows)
    assert rows[0]["payload"] == {"paid": 12}
    moved = [{"turn_id": "t", "event_id": "e-2", "payload": stored}]
    with pytest.raises(PayloadTampered, match=r"turn t payload \(e-2\)"):
        sealer.open_rows("events", list(moved[0]), moved)


def test_our_connections_read_a_sealed_jsonb_value_without_parsing_it() -> None:
    """Postgres writes a sealed jsonb value with its one-character key first; the token is
    taken from the text, and the value opens like the parsed object other connections get."""
    from durable_agent.journal.sealing import SealedJson, load_jsonb

    sealer = Sealer(StaticKeys.parse(f"k1:{K1}"))
    here = Where("t", "output", 1)
    parsed = json.loads(sealer.json({"usage": {"prompt_tokens": 2}, "x": 1}, here))
    as_postgres_writes_it = json.dumps(parsed).encode()  # {"$": "k1:...", "usage": {...}}
    loaded = load_jsonb(as_postgres_writes_it)
    assert type(loaded) is SealedJson and sealer.key_of(loaded) == "k1"
    assert sealer.open_json(loaded, here) == sealer.open_json(parsed, here)
    assert sealer.open_json(loaded, here) == {"usage": {"prompt_tokens": 2}, "x": 1}
    assert load_jsonb(b'{"a": 1}') == {"a": 1}
