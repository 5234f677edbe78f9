"""The three roles of `durable-agent roles` on a real Postgres: each process connects as its
own role and can do its job and nothing more. The application records and reads turns but
cannot write the journal, claim a turn or decide; the workers run turns but cannot decide or
delete; nobody but the tables' owner can change the audit trail. Role names take a prefix of
this test's own (roles are cluster-wide), and making them twice, or for a second database,
is safe."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from durable_agent.app import operator as ops
from durable_agent.cli import main
from durable_agent.journal import (
    Database,
    RoleNames,
    create_roles,
    migrate,
    role_names,
    set_interface,
)
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import load_tools
from durable_agent.testing import ScriptedModelServer, SmtpInbox

MESSAGE = "Please email the note launch to ada@example.com"


@pytest.fixture(autouse=True)
def python_interface() -> Iterator[None]:
    yield
    set_interface("python")  # main() sets the command line's for the rest of the process


def _as(url: str, role: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return f"postgresql://{role}@{info['host']}:{info['port']}/{info['dbname']}"


def _drop(admin_url: str, names: RoleNames, urls: list[str]) -> None:
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            for role in names:
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                if exists.fetchone():
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in names:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def roles(database_url: str, db: Database) -> Iterator[RoleNames]:
    """Roles of this test's prefix, with LOGIN (the test server trusts local logins)."""
    names = role_names(f"da_{uuid.uuid4().hex[:10]}")
    urls = [database_url]
    create_roles(db, names, {kind: "unused" for kind in ("application", "worker", "operator")})
    yield names
    db.close()
    _drop(database_url, names, urls)


@pytest.fixture
def as_role(
    settings: Settings, database_url: str, model_server: ScriptedModelServer
) -> Iterator[Callable[..., Runtime]]:
    made: list[Runtime] = []

    def make(role: str, **overrides: object) -> Runtime:
        runtime = Runtime(
            settings.model_copy(
                update={
                    "database_url": _as(database_url, role),
                    "openai_base_url": model_server.base_url,
                    **overrides,
                }
            ),
            tools=load_tools(["durable_agent_examples.email_tools"]),
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


def _refused(action: Callable[[], object]) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        action()


def test_each_role_does_its_job_and_no_more(
    roles: RoleNames, as_role: Callable[..., Runtime], inbox: SmtpInbox, database_url: str
) -> None:
    app = as_role(roles.application)
    worker = as_role(roles.worker, approval_required="send_email")
    operator = as_role(roles.operator)

    # the application records a turn and sends it; it cannot claim it or write its journal
    turn = app.start_turn("s", MESSAGE)
    _refused(lambda: app.leases.claim(turn, "app", 30.0))
    journal = app.journal.for_claim(turn, 1, empty=True)
    _refused(lambda: journal.insert_intent(0, "model", "llm", {}, "safe"))
    _refused(lambda: app.journal.record_receipt(turn, "m", "app"))

    # a worker parks it at the approval; the application cannot decide, nor can the worker
    turn_worker = worker.build_turn_worker()
    assert turn_worker.handle(turn).outcome == "parked"
    _refused(lambda: app.operator_store.decide_approval(turn, 3, "approved", None, "app"))
    _refused(lambda: worker.operator_store.decide_approval(turn, 3, "approved", None, "w"))
    _refused(lambda: app.operator_store.request_cancel(turn, "app", None))

    # the operator decides; a worker finishes the turn; the application reads the reply
    ops.approve(turn, 3, by="ops", settings=operator.settings)
    assert turn_worker.handle(turn).outcome == "done"
    assert app.get_turn(turn).status == "done"
    assert app.journal.load_journal(turn)[3].name == "send_email"
    assert inbox.count == 1

    # the audit trail: operators read it; nobody of the three changes it
    [entry] = ops.audit_trail(settings=operator.settings)
    assert (entry.action, entry.actor, entry.turn_id) == ("approve", "ops", turn)
    _refused(lambda: ops.audit_trail(settings=app.settings))
    for runtime in (app, worker, operator):
        with psycopg.connect(runtime.settings.database_url, autocommit=True) as conn:
            _refused(lambda: conn.execute("UPDATE audit_log SET actor = 'someone else'"))
            _refused(lambda: conn.execute("DELETE FROM audit_log"))
    with psycopg.connect(app.settings.database_url, autocommit=True) as conn:
        _refused(
            lambda: conn.execute(
                "INSERT INTO audit_log (actor, action, interface) VALUES ('x', 'prune', 'cli')"
            )
        )
        _refused(lambda: conn.execute("UPDATE approvals SET decision = 'denied'"))
        _refused(lambda: conn.execute("DELETE FROM turns"))
    with psycopg.connect(worker.settings.database_url, autocommit=True) as conn:
        _refused(lambda: conn.execute("UPDATE approvals SET decision = 'denied'"))
        _refused(lambda: conn.execute("DELETE FROM journal"))

    # a worker's sweeper pass (and its uncertain-effects hooks) runs under its role
    worker.sweeper().sweep_once()
    # a worker appends to the audit trail (a resume under a changed agent), not read it
    worker.operator_store.audit("agent_changed", "w", turn_id=turn, interface="worker")
    _refused(lambda: ops.audit_trail(settings=worker.settings))

    # operators record verdicts (an identity column: no grant on its sequence needed)
    with psycopg.connect(operator.settings.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO resolutions (turn_id, step, verdict, resolved_by) "
            "VALUES (%s, 3, 'ignored', 'ops')",
            (turn,),
        )
    with psycopg.connect(worker.settings.database_url, autocommit=True) as conn:
        _refused(
            lambda: conn.execute(
                "INSERT INTO resolutions (turn_id, step, verdict, resolved_by) "
                "VALUES (%s, 3, 'happened', 'w')",
                (turn,),
            )
        )

    # operators prune and cancel
    other = app.start_turn("s2", "hello")
    assert ops.cancel_turn(other, "not needed", by="ops", settings=operator.settings).cancelled
    ops.prune(3600.0, by="ops", settings=operator.settings)
    actions = {e.action for e in ops.audit_trail(settings=operator.settings)}
    assert actions == {"approve", "agent_changed", "cancel", "prune"}


def test_roles_made_again_and_for_a_second_database(
    roles: RoleNames, db: Database, new_database: Callable[[], str]
) -> None:
    create_roles(db, roles)  # again: the roles exist, the grants converge
    second = new_database()
    other = Database(second)
    try:
        migrate(other)
        create_roles(other, roles)
        with psycopg.connect(_as(second, roles.application), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM turns").fetchone() == (0,)
            _refused(lambda: conn.execute("DELETE FROM turns"))
    finally:
        other.close()  # the database goes before the roles (fixtures end in reverse)


def test_roles_print_gives_the_sql_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    assert main(["roles", "--print", "--prefix", "acme"]) == 0
    text = capsys.readouterr().out
    assert 'CREATE ROLE "acme_application" NOLOGIN' in text
    assert 'GRANT UPDATE (enqueued_at, message_id) ON turns TO "acme_application"' in text
    assert main(["roles", "--print", "--prefix", "Bad Prefix"]) == 2


def test_the_roles_command_makes_login_roles_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    database_url: str,
) -> None:
    names = role_names(f"da_{uuid.uuid4().hex[:10]}")
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DURABLE_AGENT_WORKER_PASSWORD", "a-worker-password")
    prefix = names.worker.removesuffix("_worker")
    try:
        assert main(["roles", "--prefix", prefix]) == 0
        printed = capsys.readouterr().out
        assert f"{names.worker} (login)" in printed and "a-worker-password" not in printed
        with psycopg.connect(_as(database_url, names.worker), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM journal").fetchone() == (0,)
        with pytest.raises(psycopg.OperationalError):  # no password given: no login
            psycopg.connect(_as(database_url, names.application)).close()
        assert main(["keygen", "k9"]) == 0
        assert capsys.readouterr().out.startswith("k9:")
    finally:
        _drop(database_url, names, [database_url])
