"""Rekey: every payload sealed again under the newest key, online, in batches.

Each table is read in key order a batch at a time, by queries that alias the payload
columns (``stored_*``) so that rows come back as stored, not opened. A value sealed with
an older key, or clear (written before a key was configured), is opened and sealed under
the newest key; the batch is written back in one statement that replaces a value only
while it is still the one read. Workers write on meanwhile: a value they wrote after the
read (an outcome, a reply) is sealed with the newest key already and is left alone. Nothing
is locked beyond the rows of one batch for one statement.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from .db import Database, Row
from .sealing import SealedJson, Sealer, Where

Progress = Callable[[str, int], None]
"""Told (table, rows sealed again) after each batch."""


@dataclass
class RekeyCount:
    """What a rekey saw and did: rows read and values sealed again per table, and the
    keys (None: clear) the values it sealed again had."""

    examined: Counter[str] = field(default_factory=Counter)
    resealed: Counter[str] = field(default_factory=Counter)
    from_keys: Counter[str] = field(default_factory=Counter)
    newest: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "newest_key": self.newest,
            "examined": dict(self.examined),
            "resealed": dict(self.resealed),
            "from_keys": dict(self.from_keys),
        }


def rekey(db: Database, *, batch: int = 500, progress: Progress | None = None) -> RekeyCount:
    """Seal every payload not yet under the newest key with it; the counts."""
    sealer = db.sealer
    if not sealer.enabled or sealer.newest is None:
        raise ConfigurationError(
            "rekey seals payloads under the newest key: set DURABLE_AGENT_KEYS (newest first) "
            "or DURABLE_AGENT_KEY_PROVIDER"
        )
    count = RekeyCount(newest=sealer.newest)
    tell = progress or (lambda table, done: None)
    for table, step in (
        ("turns", _turns),
        ("journal", _journal),
        ("approvals", _approvals),
        ("blobs", _blobs),
    ):
        after: tuple[Any, ...] | None = None
        while True:
            after, read, done = step(db, sealer, after, batch, count)
            count.examined[table] += read
            count.resealed[table] += done
            tell(table, done)
            if read < batch:
                break
    return count


def _stale(sealer: Sealer, stored: Any, count: RekeyCount) -> bool:
    """Whether a stored value is to be sealed again (and the key it had, counted)."""
    if stored is None:
        return False
    key = sealer.key_of(stored)
    if key == sealer.newest:
        return False
    count.from_keys[key or "clear"] += 1
    return True


def _json_text(stored: Any) -> str:
    if isinstance(stored, SealedJson):
        return stored.stored
    return json.dumps(stored, separators=(",", ":"), ensure_ascii=False)


Batch = tuple[tuple[Any, ...] | None, int, int]


def _turns(
    db: Database, sealer: Sealer, after: tuple[Any, ...] | None, batch: int, count: RekeyCount
) -> Batch:
    rows = db.run("rekey_turns_page", after="" if after is None else after[0], batch=batch)
    ids, old_m, new_m, old_r, new_r = [], [], [], [], []
    for row in rows:
        message, reply = row["stored_message"], row["stored_reply"]
        stale_message = _stale(sealer, message, count)
        stale_reply = _stale(sealer, reply, count)
        if not (stale_message or stale_reply):
            continue
        turn_id = row["turn_id"]
        ids.append(turn_id)
        old_m.append(message)
        old_r.append(reply)
        new_m.append(_reseal_text(sealer, message, Where(turn_id, "message")))
        new_r.append(
            None if reply is None else _reseal_text(sealer, reply, Where(turn_id, "reply"))
        )
    done = 0
    if ids:
        done = len(
            db.run(
                "rekey_turns",
                turn_ids=ids,
                old_messages=old_m,
                new_messages=new_m,
                old_replies=old_r,
                new_replies=new_r,
            )
        )
    return (_last(rows, "turn_id"), len(rows), done)


def _reseal_text(sealer: Sealer, stored: str, where: Where) -> str:
    return sealer.text(sealer.open_text(stored, where), where)


def _reseal_json(sealer: Sealer, stored: Any, where: Where) -> str | None:
    if stored is None:
        return None
    return sealer.json(sealer.open_json(stored, where), where)


def _journal(
    db: Database, sealer: Sealer, after: tuple[Any, ...] | None, batch: int, count: RekeyCount
) -> Batch:
    turn_after, step_after = after if after is not None else ("", -1)
    rows = db.run("rekey_journal_page", after_turn=turn_after, after_step=step_after, batch=batch)
    ids, steps, old_i, new_i, old_o, new_o = [], [], [], [], [], []
    for row in rows:
        stored_in, stored_out = row["stored_input"], row["stored_output"]
        stale_in = _stale(sealer, stored_in, count)
        stale_out = _stale(sealer, stored_out, count)
        if not (stale_in or stale_out):
            continue
        turn_id, step = row["turn_id"], row["step"]
        ids.append(turn_id)
        steps.append(step)
        old_i.append(_json_text(stored_in))
        new_i.append(_reseal_json(sealer, stored_in, Where(turn_id, "input", step)))
        old_o.append(None if stored_out is None else _json_text(stored_out))
        new_o.append(_reseal_json(sealer, stored_out, Where(turn_id, "output", step)))
    done = 0
    if ids:
        done = len(
            db.run(
                "rekey_journal",
                turn_ids=ids,
                steps=steps,
                old_inputs=old_i,
                new_inputs=new_i,
                old_outputs=old_o,
                new_outputs=new_o,
            )
        )
    return (_last(rows, "turn_id", "step"), len(rows), done)


def _approvals(
    db: Database, sealer: Sealer, after: tuple[Any, ...] | None, batch: int, count: RekeyCount
) -> Batch:
    turn_after, step_after = after if after is not None else ("", -1)
    rows = db.run("rekey_approvals_page", after_turn=turn_after, after_step=step_after, batch=batch)
    ids, steps, old, new = [], [], [], []
    for row in rows:
        stored = row["stored_arguments"]
        if not _stale(sealer, stored, count):
            continue
        turn_id, step = row["turn_id"], row["step"]
        ids.append(turn_id)
        steps.append(step)
        old.append(_json_text(stored))
        new.append(_reseal_json(sealer, stored, Where(turn_id, "arguments", step)))
    done = 0
    if ids:
        done = len(
            db.run(
                "rekey_approvals", turn_ids=ids, steps=steps, old_arguments=old, new_arguments=new
            )
        )
    return (_last(rows, "turn_id", "step"), len(rows), done)


def _blobs(
    db: Database, sealer: Sealer, after: tuple[Any, ...] | None, batch: int, count: RekeyCount
) -> Batch:
    rows = db.run("rekey_blobs_page", after="" if after is None else after[0], batch=batch)
    ids, old, new = [], [], []
    for row in rows:
        stored = row["stored_data"]
        if not _stale(sealer, stored, count):
            continue
        sha = row["sha256"]
        ids.append(sha)
        old.append(_json_text(stored))
        new.append(_reseal_json(sealer, stored, Where("", "data", blob=sha)))
    done = 0
    if ids:
        done = len(db.run("rekey_blobs", ids=ids, old_data=old, new_data=new))
    return (_last(rows, "sha256"), len(rows), done)


def _last(rows: list[Row], *names: str) -> tuple[Any, ...] | None:
    return tuple(rows[-1][name] for name in names) if rows else None
