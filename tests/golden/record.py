"""Record the golden journals: real turns, written by this version, kept as JSON.

    python tests/golden/record.py          (needs the test Postgres and Redis)

Each file holds the settings a turn ran with, its session's turns and their journals. The
test ``tests/integration/test_golden_journals.py`` loads them into a fresh database and
replays every done turn with the model switched off: a change that would make turns
recorded by an earlier version replay differently (the conversation, the step numbering,
the tool-result text, the encoding) fails it. Record again only for a change that is meant
to break in-flight turns, and say so in the upgrade notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
from durable_agent.faults import CrashPoint, Faults
from durable_agent.worker import TurnWorker

from durable_agent.journal import migrate
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import (
    PaymentsSandbox,
    ScriptedModelServer,
    SmtpInbox,
    email_policy,
    refund_policy,
)

HERE = Path(__file__).parent
ADMIN_URL = os.environ.get(
    "DURABLE_AGENT_TEST_POSTGRES", "postgresql://root@127.0.0.1:5432/postgres"
)
EMAIL = "Please email the note 'launch' to ada@example.com."


class _Crash(BaseException):
    pass


class _CrashAt(Faults):
    def maybe_crash(self, step: int, point: CrashPoint, name: str = "") -> None:
        if self.armed is not None and self.armed[1] == point and self.armed[0] in (step, name):
            raise _Crash(f"{step}:{point}")


def _run(runtime: Runtime, turn_id: str, crash: tuple[int | str, CrashPoint] | None) -> None:
    """Run the turn; with a crash point, die there on another thread (another lease owner)
    and let a fresh worker finish the turn once the dead one's claim is ended."""
    if crash is not None:
        doomed = TurnWorker(runtime, faults=_CrashAt(crash))
        thread = threading.Thread(target=lambda: _swallow(doomed, turn_id))
        thread.start()
        thread.join()
        with psycopg.connect(runtime.database.conninfo, autocommit=True) as conn:
            conn.execute("UPDATE turns SET lease_expires_at = now() WHERE turn_id = %s", (turn_id,))
    delivery = TurnWorker(runtime, faults=Faults()).handle(turn_id)
    if delivery.outcome != "done":
        raise RuntimeError(f"turn {turn_id}: {delivery.outcome} {delivery.detail}")


def _swallow(worker: TurnWorker, turn_id: str) -> None:
    with contextlib.suppress(_Crash):
        worker.handle(turn_id)


def _dump(runtime: Runtime, session_id: str, settings: Settings, name: str, about: str) -> None:
    turns = runtime.journal.list_turns(session_id)
    data: dict[str, Any] = {
        "about": about,
        "settings": {
            "model": settings.model,
            "system_prompt": settings.system_prompt,
            "tools": settings.tools,
        },
        "turns": [
            {
                "turn_id": t.turn_id,
                "seq": t.seq,
                "status": str(t.status),
                "message": t.message,
                "reply": t.reply,
                "lease_epoch": t.lease_epoch,
                "agent": t.agent,
                "agent_digest": t.agent_digest,
                "agent_spec": t.agent_spec,
            }
            for t in turns
        ],
        "journal": {
            t.turn_id: [s.as_json() for s in runtime.journal.load_journal(t.turn_id)] for t in turns
        },
    }
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"wrote {path}")


def main() -> int:
    name = f"golden_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        with ScriptedModelServer(email_policy) as email_model, SmtpInbox() as inbox:
            os.environ["SMTP_URL"], os.environ["INBOX_URL"] = inbox.smtp_url, inbox.api_url
            settings = Settings(
                database_url=url,
                tools="durable_agent_examples.email_tools",
                openai_base_url=email_model.base_url,
                openai_api_key="golden",
                model="scripted-model",
            )
            runtime = Runtime(settings)
            migrate(runtime.database)
            for session, crash, about in (
                ("email-clean", None, "lookup_note (safe), send_email (never), reply"),
                (
                    "email-interrupted-send",
                    ("send_email", "after_run"),
                    "send_email interrupted after it ran: the model is told it may or may "
                    "not have happened and checks list_sent_emails",
                ),
            ):
                turn = runtime.journal.create_turn(session, EMAIL)
                _run(runtime, turn.turn_id, crash)
                _dump(runtime, session, settings, session, about)
            session = "email-two-turns"
            for message in (EMAIL, "Now email the note 'standup' to bob@example.com."):
                turn = runtime.journal.create_turn(session, message)
                _run(runtime, turn.turn_id, None)
            _dump(runtime, session, settings, session, "a session: the second turn sees the first")
            runtime.close()
        with ScriptedModelServer(refund_policy) as refund_model, PaymentsSandbox() as payments:
            os.environ["PAYMENTS_URL"] = payments.url
            settings = Settings(
                database_url=url,
                tools="durable_agent_examples.payments_tools",
                openai_base_url=refund_model.base_url,
                openai_api_key="golden",
                model="scripted-model",
            )
            runtime = Runtime(settings)
            session = "refund-retried-with-the-same-key"
            turn = runtime.journal.create_turn(session, "Refund order A-1001 in full, please.")
            _run(runtime, turn.turn_id, ("refund_order", "after_run"))
            _dump(
                runtime,
                session,
                settings,
                session,
                "refund_order interrupted after it ran: the model checks get_order first",
            )
            runtime.close()
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
