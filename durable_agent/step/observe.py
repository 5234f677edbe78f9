"""What an observer of the steps (the tracer, ``durable_agent.telemetry``) is told.

The runner wraps each model and tool call in ``observer.observe(note)`` when it has an
observer, and fills the note in once the call returned: whether it was read back from the
journal or ran, its replay label and its recorded output (tokens, ``uncertain``). Without an
observer the runner does nothing more than before.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class StepNote:
    """One step as the runner saw it; ``ran`` and ``output`` are set after the call."""

    step: int
    kind: str  # "model" or "tool"
    name: str  # "llm" or the tool's name
    replay: str | None = None  # "safe" or "never" (None: no such tool)
    model: str | None = None  # the model requested (model steps)
    tool_call_id: str | None = None
    ran: bool = False  # False: read back from the journal
    output: dict[str, Any] | None = None

    @property
    def uncertain(self) -> bool:
        """The call may or may not have happened (an interrupted or failed ``never`` tool)."""
        return bool(self.output and self.output.get("uncertain"))


class StepObserver(Protocol):
    """Told of each step of one delivery; ``observe`` encloses the call (and sees its
    exception, if it raises)."""

    def observe(self, note: StepNote) -> AbstractContextManager[object]: ...
