"""Live turns: be told of each finished step and of the end of a turn as they are recorded.

Postgres announces every finished journal step and every turn that ends on the channel
``durable_agent`` (a trigger for the steps written without waiting for the WAL flush, the
writer itself right after a durable write; schema version 6; an announcement is delivered when
its write commits). One connection per process and database LISTENs, in a thread of
:class:`Announcements`, and wakes the watchers of that turn; each watcher then reads the
rows itself. A watcher subscribes *before* it reads, so a step recorded between its read
and its wait still wakes it: nothing is lost, and since it asks only for steps after the
last one it gave out, nothing comes twice. A lost announcement (the listening connection
dropped) costs latency only: the connection is replaced, every watcher is woken to read
again, and each watcher also reads every ``poll_seconds`` whatever it heard.

What a watcher is told is what the journal holds, so a turn whose worker died goes on
being streamed from where it was when another worker resumes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from ..errors import InvalidArgument
from ..inputs import check_id, check_timeout
from ..journal import JournalStore, Step, Turn, TurnStatus, listen

WithSpend = Callable[[list[Turn]], list[Turn]]
"""The turns with their spend ledgers (``Runtime.with_spend``)."""

log = logging.getLogger(__name__)

DEFAULT_POLL_SECONDS = 5.0
"""How often a watcher reads even when it was told nothing (a lost announcement)."""

_IDLE_SECONDS = 30.0  # the listening connection closes after this long without watchers
_TICK_SECONDS = 0.25  # how often the listening thread looks up from its connection


class Subscription:
    """One watcher of one turn: woken by the announcements about it."""

    def __init__(self, hub: Announcements, turn_id: str, *, steps: bool) -> None:
        self.hub = hub
        self.turn_id = turn_id
        self.steps = steps  # woken by finished steps too, not only by the turn's end
        self._woken = threading.Event()

    def wake(self) -> None:
        self._woken.set()

    def wait(self, timeout: float) -> bool:
        """Until an announcement about the turn arrives or ``timeout`` seconds pass; True if
        one arrived. Read the rows after this returns: whatever woke it is committed."""
        woken = self._woken.wait(max(0.0, timeout))
        self._woken.clear()
        return woken

    def close(self) -> None:
        self.hub.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Listener:
    """One run of the listening thread: told to stop, and says when it listens."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.listening = threading.Event()
        self.thread: threading.Thread | None = None


class Announcements:
    """The process's LISTEN connection to one database, and the watchers it wakes.

    The connection and its thread start with the first subscriber and stop after
    ``_IDLE_SECONDS`` without one (or at :meth:`close`).
    """

    def __init__(self, conninfo: str, *, connect_timeout: float = 5.0) -> None:
        self.conninfo = conninfo
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._watchers: dict[str, set[Subscription]] = {}
        self._listener: _Listener | None = None

    def subscribe(self, turn_id: str, *, steps: bool = True) -> Subscription:
        """Start watching ``turn_id``; returns once the process is listening (or, when
        Postgres cannot be reached for ``connect_timeout``, anyway: the watcher then reads
        every ``poll_seconds``, and is woken when the connection comes back)."""
        subscription = Subscription(self, turn_id, steps=steps)
        with self._lock:
            self._watchers.setdefault(turn_id, set()).add(subscription)
            listener = self._listener
            if listener is None or listener.thread is None or not listener.thread.is_alive():
                listener = self._listener = _Listener()
                listener.thread = threading.Thread(
                    target=self._listen,
                    args=(listener,),
                    name="durable-agent-listen",
                    daemon=True,
                )
                listener.thread.start()
        listener.listening.wait(self.connect_timeout)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            watchers = self._watchers.get(subscription.turn_id)
            if watchers is not None:
                watchers.discard(subscription)
                if not watchers:
                    del self._watchers[subscription.turn_id]

    @property
    def listening(self) -> bool:
        listener = self._listener
        return listener is not None and listener.listening.is_set()

    def close(self) -> None:
        """Stop listening (a later subscriber starts again)."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop.set()
            if listener.thread is not None and listener.thread is not threading.current_thread():
                listener.thread.join(timeout=5 * _TICK_SECONDS)

    def after_fork_in_child(self) -> None:
        # the parent's thread does not exist here and its connection is not ours
        self._lock = threading.Lock()
        self._watchers = {}
        self._listener = None

    # -- the listening thread -------------------------------------------------------------

    def _listen(self, listener: _Listener) -> None:
        backoff = 0.2
        idle_since: float | None = None
        while not listener.stop.is_set():
            try:
                conn = psycopg.connect(
                    self.conninfo,
                    autocommit=True,
                    connect_timeout=max(1, round(self.connect_timeout)),
                    application_name="durable-agent-listen",
                )
            except psycopg.Error as error:
                log.debug("cannot listen for turn announcements: %s", error)
                listener.stop.wait(backoff)
                backoff = min(backoff * 2, DEFAULT_POLL_SECONDS)
                continue
            try:
                listen(conn)
                listener.listening.set()
                self._wake_all()  # whatever was announced while no one listened: read it
                backoff = 0.2
                while not listener.stop.is_set():
                    for notice in conn.notifies(timeout=_TICK_SECONDS):
                        self._dispatch(notice.payload)
                    if self._has_watchers():
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since >= _IDLE_SECONDS:
                        with self._lock:
                            if not self._watchers and self._listener is listener:
                                self._listener = None
                                listener.stop.set()
            except psycopg.Error as error:
                log.debug("the connection listening for turn announcements dropped: %s", error)
            finally:
                listener.listening.clear()
                conn.close()
            self._wake_all()

    def _has_watchers(self) -> bool:
        with self._lock:
            return bool(self._watchers)

    def _dispatch(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        _, _, turn_id = rest.partition(" ")
        with self._lock:
            watchers = list(self._watchers.get(turn_id, ()))
        for subscription in watchers:
            if kind != "step" or subscription.steps:
                subscription.wake()

    def _wake_all(self) -> None:
        with self._lock:
            watchers = [s for group in self._watchers.values() for s in group]
        for subscription in watchers:
            subscription.wake()


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """What a watcher is told: a finished step (``kind == "step"``), or the end of the turn
    (``kind == "end"``, with the turn as it ended: its status, reply or error, and its
    spend ledger). With ``tokens=True`` also: a piece of a model call's text as it arrives
    (``"token"``, with the step and the ``attempt``, the claim's epoch), and an attempt that
    was given up before it finished (``"abandoned"``: forget its text; the step's next
    attempt, if any, comes from its start)."""

    turn_id: str
    kind: Literal["step", "end", "token", "abandoned"]
    step: Step | None = None
    turn: Turn | None = None
    # a step of a child turn (ctx.run_agent), told under the parent's step that started it
    parent_turn_id: str | None = None
    parent_step: int | None = None
    step_number: int | None = None  # of a token or abandoned event
    attempt: int | None = None
    text: str = ""
    cursor: str | None = None  # with tokens: where to go on from (live_tokens.Cursor)

    @property
    def id(self) -> str:
        """Where to go on from: without tokens the step number, or ``end``: pass the last
        step's number back as ``after_step`` (a server-sent events' ``Last-Event-ID``); with
        tokens a cursor to pass back as ``after``. A child turn's step gives the parent's
        step before the one that started the child: going on from there tells the child's
        steps again rather than skip any."""
        if self.cursor is not None:
            return self.cursor
        if self.parent_step is not None:
            return str(self.parent_step - 1)
        return str(self.step.step) if self.step is not None else "end"

    def as_json(self) -> dict[str, Any]:
        if self.step is not None:
            under = (
                {"parent_turn_id": self.parent_turn_id, "parent_step": self.parent_step}
                if self.parent_turn_id is not None
                else {}
            )
            return {"event": "step", "turn_id": self.turn_id, **self.step.as_json(), **under}
        if self.kind in ("token", "abandoned"):
            event = {"event": self.kind, "turn_id": self.turn_id, "step": self.step_number}
            event["attempt"] = self.attempt
            if self.kind == "token":
                event["text"] = self.text
            return event
        assert self.turn is not None
        return {"event": "end", **self.turn.as_json()}


def check_after_step(value: Any) -> int:
    """``after_step``: -1 (from the start) or a step number."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidArgument(f"after_step must be a whole number >= -1, not {value!r}")
    return value


def stream_turn(
    store: JournalStore,
    announcements: Announcements,
    with_spend: WithSpend,
    turn_id: str,
    *,
    after_step: int = -1,
    timeout: float | None = None,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
) -> Generator[TurnEvent, None, None]:
    """Each finished step of the turn after ``after_step``, in order, as it is recorded,
    then one ``end`` event once the turn is done or failed. TimeoutError after ``timeout``
    seconds (None: no limit) without the end. A bad argument (InvalidArgument) or an
    unknown id (TurnNotFound) fails here, before the first event is asked for."""
    check_id("turn_id", turn_id)
    first = check_after_step(after_step) + 1
    deadline = _deadline(timeout)
    poll_seconds = _check_poll(poll_seconds)
    store.get_turn(turn_id)
    return _stream(
        store, announcements, with_spend, turn_id, first, deadline, timeout, poll_seconds
    )


def _stream(
    store: JournalStore,
    announcements: Announcements,
    with_spend: WithSpend,
    turn_id: str,
    next_step: int,
    deadline: float | None,
    timeout: float | None,
    poll_seconds: float,
) -> Generator[TurnEvent, None, None]:
    children: dict[str, int] = {}  # child turn id -> its next step to tell
    watches: list[Subscription] = []  # of the children, closed with the stream
    with announcements.subscribe(turn_id) as subscription, _closing(watches):
        while True:
            # the turn first: when it has ended, the steps read after it are all of them
            turn = store.get_turn(turn_id)
            for step in store.load_journal_from(turn_id, next_step):
                child = _child_of(step)
                if child is not None:  # a child agent's steps, under the step that started it
                    yield from _child_steps(
                        store,
                        (announcements, subscription, watches),
                        children,
                        turn_id,
                        step.step,
                        child,
                    )
                if step.step != next_step or step.status != "done":
                    break  # steps finish in order: the rest is still running
                yield TurnEvent(turn_id, "step", step=step)
                next_step += 1
            if turn.finished:
                yield TurnEvent(turn_id, "end", turn=with_spend([turn])[0])
                return
            _wait(subscription, turn, poll_seconds, deadline, timeout)


def _child_of(step: Step) -> str | None:
    child = step.input.get("child_turn_id") if step.kind == "wait" else None
    return child if isinstance(child, str) else None


@contextmanager
def _closing(watches: list[Subscription]) -> Iterator[None]:
    try:
        yield
    finally:
        for watch in watches:
            watch.close()


def _child_steps(
    store: JournalStore,
    hub: tuple[Announcements, Subscription, list[Subscription]],
    children: dict[str, int],
    parent_turn_id: str,
    parent_step: int,
    child: str,
) -> Generator[TurnEvent, None, None]:
    """The child turn's finished steps not told yet (and its children's, nested)."""
    if child not in children:
        if store.find_turn(child) is None:
            return  # not created yet
        children[child] = 0
        announcements, subscription, watches = hub
        watch = announcements.subscribe(child)
        watch._woken = subscription._woken  # the child's announcements wake this watcher too
        watches.append(watch)
    for step in store.load_journal_from(child, children[child]):
        grandchild = _child_of(step)
        if grandchild is not None:
            yield from _child_steps(store, hub, children, child, step.step, grandchild)
        if step.step != children[child] or step.status != "done":
            break
        yield TurnEvent(
            child, "step", step=step, parent_turn_id=parent_turn_id, parent_step=parent_step
        )
        children[child] += 1


def wait_until_finished(
    store: JournalStore,
    announcements: Announcements,
    turn_id: str,
    timeout: float,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
) -> Turn:
    """The turn once it is done, failed or cancelled, woken by the announcement of its end
    (and reading every ``poll_seconds`` regardless); TimeoutError after ``timeout``
    seconds. A write that ends a turn announces it (``Leases._end``, ``announce``); one
    that does not is still seen within ``poll_seconds``."""
    check_id("turn_id", turn_id)
    deadline = _deadline(check_timeout(timeout))
    poll_seconds = _check_poll(poll_seconds)
    turn = store.get_turn(turn_id)
    if turn.finished:
        return turn
    with announcements.subscribe(turn_id, steps=False) as subscription:
        while True:
            turn = store.get_turn(turn_id)
            if turn.finished:
                return turn
            _wait(subscription, turn, poll_seconds, deadline, timeout)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + check_timeout(timeout)


def _check_poll(poll_seconds: float) -> float:
    if check_timeout(poll_seconds) <= 0:
        raise InvalidArgument("poll_seconds must be more than 0")
    return float(poll_seconds)


def _wait(
    subscription: Subscription,
    turn: Turn,
    poll_seconds: float,
    deadline: float | None,
    timeout: float | None,
) -> None:
    """Wait for the next announcement; TimeoutError once the deadline has passed."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            last_error = f", last error: {turn.error}" if turn.error else ""
            if turn.status == TurnStatus.WAITING:
                last_error = ", parked: it waits (an approval, a time, an event or a child turn)"
            raise TimeoutError(
                f"turn {turn.turn_id} is still {turn.status} after {timeout:g}s "
                f"(attempts {turn.attempts}{last_error})"
            )
        poll_seconds = min(poll_seconds, left)
    subscription.wait(poll_seconds)
