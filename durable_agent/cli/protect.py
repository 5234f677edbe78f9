"""The commands that protect the journal: ``rekey``, ``audit``, ``roles`` and ``keygen``
(registered on the ``durable-agent`` parser by ``cli/__init__.py``)."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from ..inputs import check_id
from ..journal import DEFAULT_PREFIX, KINDS, create_roles, new_key, role_names, roles_sql
from ..operate.cancel import check_by
from ..operate.protection import ACTIONS, audit_entries, rekey_payloads
from ..redact import printable
from .arguments import since_on_clock, since_time, whole_number
from .operator import Add

if TYPE_CHECKING:
    from ..runtime import Runtime

PASSWORD_VARIABLES = {kind: f"DURABLE_AGENT_{kind.upper()}_PASSWORD" for kind in KINDS}
"""The environment variables that give a role a password (it may log in then)."""


def cmd_rekey(runtime: Runtime, args: argparse.Namespace) -> int:
    if args.by is not None:
        check_by(args.by)
    runtime.require_schema()
    count = rekey_payloads(runtime.database, runtime.operator_store, batch=args.batch, by=args.by)
    if args.json:
        print(json.dumps(count.as_json(), indent=2))
    else:
        resealed = ", ".join(f"{n} {table}" for table, n in count.resealed.items()) or "nothing"
        found = ", ".join(f"{n} under {key}" for key, n in count.from_keys.items()) or "none"
        print(f"sealed again under key {count.newest}: {resealed} (values found: {found})")
    return 0


def cmd_audit(runtime: Runtime, args: argparse.Namespace) -> int:
    if args.turn is not None:
        check_id("turn", args.turn)
    since = since_time(args.since) if args.since is not None else None
    runtime.require_schema()
    entries = audit_entries(
        runtime.operator_store,
        turn_id=args.turn,
        action=args.action,
        since=since_on_clock(since, runtime),
        limit=args.limit,
    )
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=2, ensure_ascii=False))
        return 0
    from .console import out

    table = Table(title="audit trail", title_justify="left")
    for column in ("at", "actor", "action", "via", "turn", "step", "before", "after"):
        table.add_column(column, overflow="fold")
    for e in entries:
        cells = (
            e.at.strftime("%Y-%m-%d %H:%M:%S"),
            e.actor,
            e.action,
            e.interface,
            e.turn_id or "-",
            "-" if e.step is None else str(e.step),
            json.dumps(e.before, ensure_ascii=False) if e.before is not None else "-",
            json.dumps(e.after, ensure_ascii=False) if e.after is not None else "-",
        )
        table.add_row(*(Text(printable(cell)) for cell in cells))
    out.print(table)
    return 0


def cmd_roles(runtime: Runtime, args: argparse.Namespace) -> int:
    names = role_names(args.prefix)
    if args.print:
        print(roles_sql(names, args.schema, args.database or "durable_agent"))
        return 0
    runtime.require_schema()
    passwords = {
        kind: os.environ[variable]
        for kind, variable in PASSWORD_VARIABLES.items()
        if os.environ.get(variable)
    }
    schema, database = create_roles(runtime.database, names, passwords)
    login = ", ".join(f"{getattr(names, kind)} (login)" for kind in passwords)
    print(
        f"roles {', '.join(names)} granted on {schema} of {database}"
        + (f"; with a password: {login}" if login else "")
    )
    return 0


def cmd_keygen(runtime: Runtime | None, args: argparse.Namespace) -> int:
    print(f"{args.key_id}:{new_key()}")
    return 0


def _key_id(text: str) -> str:
    if not re.match(r"^[A-Za-z0-9_-]{1,32}$", text):
        raise argparse.ArgumentTypeError("1 to 32 letters, digits, '-' or '_'")
    return text


def register(add: Add) -> None:
    """Add rekey, audit, roles and keygen to the ``durable-agent`` parser."""
    rekey = add("rekey", cmd_rekey, "seal every payload under the newest key (online, in batches)")
    rekey.add_argument("--batch", type=whole_number(1, 10_000), default=500, help="rows per batch")
    rekey.add_argument("--by", default=None, help="who (default: user@host)")
    rekey.add_argument("--json", action="store_true", help="print the counts as JSON")

    audit = add("audit", cmd_audit, "the audit trail of operator actions, newest first")
    audit.add_argument("--turn", default=None, help="one turn only")
    audit.add_argument("--action", choices=ACTIONS, default=None, help="one action only")
    audit.add_argument("--since", default=None, help="an age (2h, 7d) or an ISO time")
    audit.add_argument("--limit", type=whole_number(1, 100_000), default=100, help="at most")
    audit.add_argument("--json", action="store_true", help="a JSON array of entries")

    roles = add(
        "roles",
        cmd_roles,
        "create the application, worker and operator roles and their grants (--print: the SQL)",
    )
    roles.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help="role names are PREFIX_application, ..."
    )
    roles.add_argument("--print", action="store_true", help="print the SQL, change nothing")
    roles.add_argument("--schema", default="public", help="with --print: the schema")
    roles.add_argument("--database", default=None, help="with --print: the database")

    keygen = add("keygen", cmd_keygen, "print a new key for DURABLE_AGENT_KEYS")
    keygen.add_argument("key_id", type=_key_id, help="its id, e.g. k3")
