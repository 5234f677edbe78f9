"""The runtime's live reads: wait for a turn's end, stream its steps (and tokens).

A mixin of :class:`~durable_agent.runtime.Runtime`, which gives it the parts it reads.
"""

from __future__ import annotations

from collections.abc import Generator

from ..errors import InvalidArgument
from ..journal import JournalStore, Turn
from .live import DEFAULT_POLL_SECONDS, Announcements, TurnEvent, stream_turn, wait_until_finished
from .live_tokens import open_token_stream
from .tokens import TokenStreams


class LiveReads:
    """``wait_for_turn`` and ``stream_turn`` over the parts of a runtime."""

    @property
    def journal(self) -> JournalStore:
        raise NotImplementedError

    @property
    def announcements(self) -> Announcements:
        raise NotImplementedError

    @property
    def token_streams(self) -> TokenStreams | None:
        raise NotImplementedError

    def with_spend(self, turns: list[Turn]) -> list[Turn]:
        raise NotImplementedError

    def wait_for_turn(
        self, turn_id: str, timeout: float = 60.0, poll_seconds: float = DEFAULT_POLL_SECONDS
    ) -> Turn:
        """Wait until the turn is done, failed or cancelled; raises TimeoutError after
        ``timeout`` s (a turn waiting for an approval has not ended).

        Woken by Postgres' announcement of the turn's end; ``poll_seconds`` is only how often
        it reads anyway, in case an announcement is lost."""
        return wait_until_finished(self.journal, self.announcements, turn_id, timeout, poll_seconds)

    def stream_turn(
        self,
        turn_id: str,
        *,
        after_step: int = -1,
        timeout: float | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        tokens: bool = False,
        after: str | None = None,
    ) -> Generator[TurnEvent, None, None]:
        """Each finished step after ``after_step`` as it is recorded, then the end (see
        :func:`durable_agent.operate.live.stream_turn`); with ``tokens`` the text of the
        model's answers as it arrives too, resumed from an event's id as ``after`` (see
        :mod:`durable_agent.operate.live_tokens`)."""
        if tokens:
            return open_token_stream(
                self.journal,
                self.announcements,
                self.with_spend,
                self.token_streams,
                turn_id,
                after=after,
                after_step=after_step,
                timeout=timeout,
                poll_seconds=poll_seconds,
            )
        if after is not None:
            raise InvalidArgument("after is the cursor of a token stream: pass tokens=True")
        return stream_turn(
            self.journal,
            self.announcements,
            self.with_spend,
            turn_id,
            after_step=after_step,
            timeout=timeout,
            poll_seconds=poll_seconds,
        )
