"""A new turn's id, and what a start that names an existing turn's id gets back."""

from __future__ import annotations

import uuid

from ..errors import InvalidArgument
from .records import Turn


def new_turn_id() -> str:
    return "turn_" + uuid.uuid4().hex


def submitted_again(
    existing: Turn, session_id: str, message: str, agent: str, error: Exception
) -> Turn:
    """The turn a retried start names by its id, if it is the same turn; else InvalidArgument."""
    if (existing.session_id, existing.message, existing.agent) != (session_id, message, agent):
        raise InvalidArgument(
            f"turn id {existing.turn_id!r} is already used by a turn with another "
            "session, message or agent"
        ) from error
    return existing
