"""Retention: prune finished turns.

``prune`` deletes finished turns older than a cutoff, with their journal, approvals,
cancellations and resolutions, then the blobs nothing refers to any more, in batches of
short transactions that skip rows someone else holds. It keeps a turn with an uncertain
effect not yet resolved, and every turn of a session that still has an open turn (whose
conversation is built from them).
"""

from __future__ import annotations

import logging
import re

from ..errors import InvalidArgument
from ..inputs import check_count
from ..journal import OperatorStore, PruneCount
from .cancel import check_by

log = logging.getLogger(__name__)

BLOB_GRACE_SECONDS = 3600.0  # a blob younger than this may be about to be referred to
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` in seconds, or InvalidArgument."""
    match = _AGE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(
            f"not an age: {text!r} (a number and a unit: s, m, h, d or w, e.g. 30d)"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not 0 < seconds <= 100 * 365 * 86_400:
        raise InvalidArgument(f"age {text!r} must be more than 0 and at most 100 years")
    return seconds


def prune(
    store: OperatorStore,
    older_than: float | str,
    *,
    dry_run: bool = False,
    batch: int = 500,
    blob_grace_seconds: float = BLOB_GRACE_SECONDS,
    by: str | None = None,
) -> PruneCount:
    """Delete finished turns that ended more than ``older_than`` ago (seconds, or an age such
    as ``"30d"``; see the module docstring); with ``dry_run``, only count them."""
    older_than_seconds = parse_age(older_than) if isinstance(older_than, str) else older_than
    if isinstance(older_than_seconds, bool) or not isinstance(older_than_seconds, int | float):
        raise InvalidArgument("older_than_seconds must be a number of seconds")
    if not 0 < older_than_seconds < float("inf"):
        raise InvalidArgument("older_than_seconds must be more than 0")
    check_count("batch", batch, 10_000)
    who = check_by(by)
    preview = store.prune_preview(older_than_seconds)
    if dry_run:
        return preview
    turns = steps = blobs = 0
    while True:
        done = store.prune_turns(older_than_seconds, batch)
        turns, steps = turns + done.turns, steps + done.steps
        if done.turns < batch:
            break
    while True:
        deleted = store.prune_blobs(blob_grace_seconds, batch)
        blobs += deleted
        if deleted < batch:
            break
    log.info("pruned %d turns, %d steps, %d blobs", turns, steps, blobs)
    store.audit(
        "prune",
        who,
        before={"older_than_seconds": older_than_seconds, "prunable_turns": preview.turns},
        after={"turns": turns, "steps": steps, "blobs": blobs, "kept": preview.kept},
    )
    return PruneCount(
        turns=turns,
        steps=steps,
        kept=preview.kept,
        blobs=blobs,
        kept_open_session=preview.kept_open_session,
    )
