"""Keeps a claim alive while its turn runs, and notices when it is gone.

A thread renews the lease every third of its length, so a long
model or tool call does not let the lease run out. When a renewal finds the epoch moved on
(another worker took the turn) or cannot reach Postgres for a whole lease, the claim is
marked lost: the runner then stops before its next step and before any ``never`` tool.
"""

from __future__ import annotations

import logging
import threading
import time

from ..errors import DurableAgentError, LeaseLost
from ..journal.leases import Leases

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews one claim in the background; ``check()`` raises once the claim is lost."""

    def __init__(self, leases: Leases, turn_id: str, epoch: int, lease_seconds: float) -> None:
        self.leases = leases
        self.turn_id = turn_id
        self.epoch = epoch
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        self.lost = threading.Event()
        self.reason = ""
        self.unreachable = False  # lost because Postgres could not be reached, not taken over
        self._stop = threading.Event()
        self._last_renewal = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{turn_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._last_renewal = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.lease_seconds)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                renewed = self.leases.renew(self.turn_id, self.epoch, self.lease_seconds)
            except DurableAgentError as error:
                if time.monotonic() - self._last_renewal >= self.lease_seconds:
                    self.unreachable = True
                    self._mark_lost(f"could not renew the lease for {self.lease_seconds}s: {error}")
                    return
                continue
            if not renewed:
                self._mark_lost("another worker took the turn over (its epoch moved on)")
                return
            self._last_renewal = time.monotonic()

    def _mark_lost(self, reason: str) -> None:
        self.reason = reason
        self.lost.set()
        log.warning(
            "turn %s: claim at epoch %d lost: %s; stopping before the next step",
            self.turn_id,
            self.epoch,
            reason,
        )

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(f"turn {self.turn_id}: claim at epoch {self.epoch} lost: {self.reason}")

    def still_claimed(self) -> bool:
        if self.lost.is_set():
            return False
        try:
            return self.leases.still_held(self.turn_id, self.epoch)
        except DurableAgentError:
            return False
