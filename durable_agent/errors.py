"""The errors durable-agent raises.

The tree is shallow on purpose::

    DurableAgentError
    ├── InvalidArgument           a call was given a bad value (an id, a message, a timeout)
    ├── ConfigurationError        a setting, URL or tools module is wrong (fix the config)
    │   ├── ToolDefinitionError   a @tool is declared wrongly (fails at import)
    │   └── KeyUnavailable        a payload is sealed with a key the keyring does not hold
    ├── PayloadTampered           a sealed payload does not open: altered, or moved from its row
    ├── ServiceUnavailable        Postgres or the broker cannot be reached (retryable)
    ├── TurnNotFound              no turn has that id
    ├── TurnEnded                 the turn has ended: an event for it is not recorded
    ├── TurnFailed                the turn ended as failed; ``reason`` says why
    │   ├── ReplayDiverged        the journal records another call at this step
    │   └── StepLimitReached      the turn hit its step cap
    ├── ModelUnavailable          the model API kept failing; the turn stays resumable (retryable)
    ├── LeaseLost                 another worker owns the turn now; stop, write nothing more
    ├── TurnCancelled             someone cancelled the turn; it ends 'cancelled' at this step
    └── TurnParked                the turn waits (an approval, a time, an event, a child); parked

``retryable`` says whether running the same thing again later can succeed.
The driver's own exception is kept as ``__cause__``.
"""

from __future__ import annotations


class DurableAgentError(Exception):
    """Base class of every error this library raises on purpose."""

    retryable = False


class InvalidArgument(DurableAgentError, ValueError):
    """A value handed to durable-agent is not acceptable; nothing was written or sent."""


class ConfigurationError(DurableAgentError):
    """A setting, URL, or tools module is wrong. Fix the configuration and run again."""


class ToolDefinitionError(ConfigurationError):
    """A tool is declared wrongly: missing or unknown label, duplicate name, bad signature."""


class KeyUnavailable(ConfigurationError):
    """A payload is sealed with a key that is unknown or retired; the message names the key
    id and the row. Give the key back (``DURABLE_AGENT_KEYS``, the key provider)."""


class PayloadTampered(DurableAgentError):
    """A sealed payload does not open under its key: it was altered, or copied from another
    row (its associated data binds it to its turn, step and field). Never read as garbage."""


class ServiceUnavailable(DurableAgentError):
    """Postgres or the broker cannot be reached."""

    retryable = True


class TurnNotFound(DurableAgentError):
    """No turn has this id."""

    def __init__(self, turn_id: str, *, hint: str = "") -> None:
        super().__init__(f"no turn with id {turn_id!r}" + (f" ({hint})" if hint else ""))
        self.turn_id = turn_id


class TurnEnded(DurableAgentError):
    """The turn has ended (done, failed or cancelled): what was sent to it is not recorded."""

    def __init__(self, turn_id: str, status: str, what: str) -> None:
        super().__init__(f"turn {turn_id} has ended ({status}); {what}")
        self.turn_id, self.status = turn_id, status


class TurnFailed(DurableAgentError):
    """The turn cannot finish; it is recorded as failed with this reason."""


class ReplayDiverged(TurnFailed):
    """This run makes a different call at a step than the one the journal records."""

    def __init__(
        self,
        turn_id: str,
        step: int,
        detail: str,
        *,
        recorded: str | None = None,
        current: str | None = None,
    ) -> None:
        super().__init__(f"replay diverged in turn {turn_id} at step {step}: {detail}")
        self.turn_id, self.step, self.recorded, self.current = turn_id, step, recorded, current


class StepLimitReached(TurnFailed):
    """The turn used every step it was allowed."""


class ModelUnavailable(DurableAgentError):
    """The model API failed after its retries; the turn keeps its journal and runs again later."""

    retryable = True


class ModelRateLimited(ModelUnavailable):
    """The model API answered 429 after its retries; fed back into the model's budget."""


class BudgetExhausted(DurableAgentError):
    """The model's shared budget (requests or tokens a minute) has no room for this call now;
    the turn waits ``retry_after`` seconds without holding a worker, and is not failed."""

    retryable = True

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LeaseLost(DurableAgentError):
    """Another worker took this turn over (its epoch moved on); this worker must stop the turn."""

    retryable = True


class TurnCancelled(DurableAgentError):
    """Someone asked the turn to stop (``cancel_turn``); the worker ends it as cancelled at
    this step boundary and writes nothing more."""


class TurnParked(DurableAgentError):
    """The turn waits (a person's approval, a time, an event, a child turn): it is parked
    (status ``waiting``, no claim, no message) until that comes, and any worker then
    resumes it."""
