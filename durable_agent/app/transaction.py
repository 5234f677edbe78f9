"""``start_turn(connection=...)``: a turn recorded in the application's own transaction, its
doorbell (the ``run_turn`` message) rung only once that transaction has committed.

What the application may lend us, and when the doorbell rings:

* a SQLAlchemy ``Session`` (or a ``scoped_session``): from the Session's ``after_commit``
  event, right after the commit of its outermost transaction. A rollback, also of a
  savepoint (``begin_nested``) the turn was recorded in, or a close without a commit, drops
  it: nothing is sent.
* a SQLAlchemy ``Connection``: Core has no event after a commit, only one just before it
  (``commit``). From there a short-lived thread waits until the turn is visible on
  durable-agent's own connection (the commit landed) and rings then; a rollback drops it; a
  turn that never becomes visible within the sweeper's grace period is left to the sweeper.
* a psycopg 3 ``Connection``: psycopg has no commit hook. The turn is recorded in the
  transaction and nothing is sent: the sweeper sends it as ``never enqueued`` once it is
  older than its grace period (see docs/how-to/application-transactions.md for how long).

SQLAlchemy is imported only when the application hands us one of its objects (it has
imported SQLAlchemy by then); the worker never imports this module.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigurationError, InvalidArgument, ServiceUnavailable
from ..journal import Database, JournalStore, TurnStatus, record_turn
from ..step.faults import Faults

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session, SessionTransaction

    from ..delivery.sweeper import Sweeper

log = logging.getLogger(__name__)

_PENDING = "durable_agent.doorbells"


class StartParts(Protocol):
    """What a start in the application's transaction uses of the runtime (``Runtime``
    satisfies it; this module is below it and does not import it): its parts are used after
    the commit, from the application's commit hook or a thread of its own."""

    @property
    def database(self) -> Database: ...

    @property
    def journal(self) -> JournalStore: ...

    def agent_queue(self, agent: str | None) -> tuple[str, str]: ...

    def enqueue(self, session_id: str, turn_id: str, queue: str = "", trace: str = "") -> None: ...

    def trace_context(self) -> str | None: ...

    def sweeper(self) -> Sweeper: ...


_FIRST_LOOK, _LONGEST_LOOK = 0.002, 0.1


@dataclass(frozen=True, slots=True)
class Doorbell:
    """The message of one turn, to send once the transaction that recorded it commits."""

    runtime: StartParts
    session_id: str
    turn_id: str
    queue: str
    trace: str = ""  # the trace context stored with the turn (tracing on)

    @property
    def key(self) -> tuple[str, str]:
        return ("start", self.turn_id)

    def visible(self) -> bool:
        """Whether the transaction that recorded the turn has committed (seen from
        durable-agent's own connection)."""
        return self.runtime.journal.find_turn(self.turn_id) is not None

    def grace_seconds(self) -> float:
        return self.runtime.sweeper().grace_seconds

    def ring(self) -> None:
        """Send it now (its message id noted first, as every send does). Never raises: the
        application's transaction has committed, and the sweeper sends what is not sent."""
        try:
            Faults.from_env().maybe_crash_before_doorbell()
            self.runtime.enqueue(self.session_id, self.turn_id, self.queue, self.trace)
        except ServiceUnavailable as error:
            log.warning("turn %s is recorded; %s; the sweeper will enqueue it", self.turn_id, error)
        except Exception:
            log.exception("turn %s is recorded; the sweeper will enqueue it", self.turn_id)


def start_in_transaction(
    runtime: StartParts,
    connection: object,
    session_id: str,
    message: str,
    *,
    turn_id: str | None,
    agent: str | None,
    concurrency_key: str | None = None,
) -> str:
    """Record the turn on ``connection`` in its transaction; ring after the commit."""
    lent = lend(connection)
    name, queue = runtime.agent_queue(agent)
    conn = lent.psycopg_connection()
    check_same_database(runtime, conn)
    trace = runtime.trace_context()  # the caller's span, when tracing is on
    turn = record_turn(
        conn,
        session_id,
        message,
        turn_id,
        queue=queue,
        agent=name,
        concurrency_key=concurrency_key,
        trace_context=trace,
        sealer=runtime.database.sealer,
    )
    if turn.status in (TurnStatus.QUEUED, TurnStatus.RUNNING):
        ring = Doorbell(runtime, turn.session_id, turn.turn_id, turn.queue, trace or "")
        lent.after_commit(ring)
    return turn.turn_id


def check_same_database(
    runtime: StartParts | Any, conn: psycopg.Connection[Any], what: str = "start_turn"
) -> None:
    """ConfigurationError unless ``conn`` reaches the database of ``runtime``."""
    ours = conninfo_to_dict(runtime.database.conninfo).get("dbname")
    if ours and conn.info.dbname != ours:
        raise ConfigurationError(
            f"the connection given to {what} reaches the database {conn.info.dbname!r}, "
            f"durable-agent's is {ours!r} (DURABLE_AGENT_DATABASE_URL): a turn recorded there "
            "would never run"
        )


class Bell(Protocol):
    """What to do once the application's transaction commits: a turn's ``Doorbell``, or the
    send of a turn woken in it (``app/wakes.py``)."""

    @property
    def key(self) -> tuple[str, str]:
        """One bell per key and transaction (the same turn started twice: one message)."""
        ...

    def visible(self) -> bool:
        """Whether what the transaction wrote is visible on durable-agent's own connection
        (it committed)."""
        ...

    def grace_seconds(self) -> float:
        """How long to look for ``visible`` before leaving the send to the sweeper."""
        ...

    def ring(self) -> None:
        """Send now; never raises (the sweeper sends what is not sent)."""
        ...


class Lent(Protocol):
    """A connection of the application: its psycopg connection, and its commit."""

    def psycopg_connection(self) -> psycopg.Connection[Any]: ...

    def after_commit(self, doorbell: Bell) -> None: ...


def lend(connection: object) -> Lent:
    """The application's ``connection`` (SQLAlchemy Session, scoped_session or Connection on
    psycopg 3, or a psycopg 3 Connection), or InvalidArgument / ConfigurationError."""
    if isinstance(connection, psycopg.Connection):
        return _LentPsycopg(connection)
    if isinstance(connection, psycopg.AsyncConnection):
        raise InvalidArgument(_NOT_ASYNC)
    if _from_sqlalchemy(connection):
        from sqlalchemy.engine import Connection as SAConnection
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(connection, scoped_session):
            connection = connection()
        if isinstance(connection, Session):
            return _LentSession(connection)
        if isinstance(connection, SAConnection):
            return _LentConnection(connection)
        if _from_sqlalchemy(connection, "sqlalchemy.ext.asyncio"):
            raise InvalidArgument(_NOT_ASYNC)
    raise InvalidArgument(
        "connection= takes a SQLAlchemy Session or Connection, or a psycopg 3 Connection, "
        f"not {type(connection).__module__}.{type(connection).__qualname__}"
    )


_NOT_ASYNC = (
    "start_turn(connection=...) takes a synchronous Session or Connection (SQLAlchemy) or "
    "psycopg connection; async ones are not supported: start the turn on a synchronous one"
)


def _from_sqlalchemy(value: object, package: str = "sqlalchemy") -> bool:
    """Whether ``value`` is an object of (a subclass of) a class of ``package``."""
    return any(
        c.__module__ == package or c.__module__.startswith(package + ".")
        for c in type(value).__mro__
    )


def _driver_connection(connection: SAConnection) -> psycopg.Connection[Any]:
    """The psycopg 3 connection under a SQLAlchemy one; ConfigurationError for another driver."""
    driver = connection.connection.driver_connection
    if isinstance(driver, psycopg.Connection):
        return driver
    dialect = connection.dialect
    raise ConfigurationError(
        "start_turn(connection=...) needs SQLAlchemy on the psycopg 3 driver "
        f"(postgresql+psycopg://...); this engine uses {dialect.name}+{dialect.driver}"
    )


class _LentPsycopg:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def psycopg_connection(self) -> psycopg.Connection[Any]:
        return self.conn

    def after_commit(self, doorbell: Bell) -> None:
        """Nothing to do: psycopg has no commit hook, so the sweeper sends the turn as
        never enqueued after its grace period (or the application starts it again by its
        id after its commit, which sends it at once); a woken turn is sent by a worker's
        waker as the commit delivers its announcement, else by the sweeper's next pass."""


class _LentSession:
    """A Session: its ``after_commit`` event rings what the committed transaction recorded."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def psycopg_connection(self) -> psycopg.Connection[Any]:
        return _driver_connection(self.session.connection())  # begins the Session's transaction

    def after_commit(self, doorbell: Bell) -> None:
        session = self.session
        if _PENDING not in session.info:
            session.info[_PENDING] = []
            _listen_to(session)
        if any(d.key == doorbell.key for _, d in session.info[_PENDING]):
            return  # the same turn started twice in this transaction: one message
        recorded_in = session.get_nested_transaction() or session.get_transaction()
        session.info[_PENDING].append((_chain(recorded_in), doorbell))


def _chain(transaction: SessionTransaction | None) -> list[SessionTransaction]:
    """The transaction and every one it is nested in."""
    chain = []
    while transaction is not None:
        chain.append(transaction)
        transaction = transaction.parent
    return chain


def _listen_to(session: Session) -> None:
    from sqlalchemy import event

    def committed(session: Session) -> None:
        root = session.get_transaction()
        if root is not None and root.is_active:
            return  # a savepoint was released: the outer transaction goes on
        pending = session.info.get(_PENDING, [])
        session.info[_PENDING] = []
        for _, doorbell in pending:
            doorbell.ring()

    def rolled_back(session: Session, previous: SessionTransaction) -> None:
        pending = session.info.get(_PENDING, [])
        session.info[_PENDING] = [(c, d) for c, d in pending if previous not in c]

    def ended(session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # closed without a commit: the turns are gone
            session.info[_PENDING] = []

    event.listen(session, "after_commit", committed)
    event.listen(session, "after_soft_rollback", rolled_back)
    event.listen(session, "after_transaction_end", ended)


class _LentConnection:
    """A Core Connection: rung once the turn is visible after its ``commit`` event."""

    def __init__(self, connection: SAConnection) -> None:
        self.connection = connection

    def psycopg_connection(self) -> psycopg.Connection[Any]:
        if not self.connection.in_transaction():
            self.connection.begin()  # what SQLAlchemy's autobegin does for any statement
        return _driver_connection(self.connection)

    def after_commit(self, doorbell: Bell) -> None:
        connection = self.connection
        if _PENDING not in connection.info:
            connection.info[_PENDING] = []
            _watch_commits(connection)
        if all(d.key != doorbell.key for d in connection.info[_PENDING]):
            connection.info[_PENDING].append(doorbell)


def _watch_commits(connection: SAConnection) -> None:
    from sqlalchemy import event

    def committing(connection: SAConnection) -> None:
        pending = connection.info.get(_PENDING, [])
        connection.info[_PENDING] = []
        if pending:
            threading.Thread(
                target=_ring_when_visible,
                args=(pending,),
                name="durable-agent-doorbell",
                daemon=True,
            ).start()

    def rolling_back(connection: SAConnection) -> None:
        connection.info[_PENDING] = []

    event.listen(connection, "commit", committing)
    event.listen(connection, "rollback", rolling_back)


def _ring_when_visible(pending: list[Bell]) -> None:
    """Ring each doorbell once what it recorded is visible, i.e. its transaction committed
    (the ``commit`` event comes just before the commit); give up after the sweeper's grace."""
    grace = pending[0].grace_seconds()
    deadline = time.monotonic() + grace
    look = _FIRST_LOOK
    while pending:
        try:
            visible = [d for d in pending if d.visible()]
        except Exception as error:
            log.warning("turns recorded; %s; the sweeper will enqueue them", error)
            return
        for doorbell in visible:
            doorbell.ring()
        pending = [d for d in pending if d not in visible]
        if not pending or time.monotonic() + look > deadline:
            return
        time.sleep(look)
        look = min(look * 2, _LONGEST_LOOK)
