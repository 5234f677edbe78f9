"""The `durable-agent` command line, run as a real process against Postgres and Redis."""

from __future__ import annotations

import json
import socket
import subprocess

import psycopg
import redis
from inprocess import run_cli

from durable_agent.journal import Claim, JournalStore, Leases
from durable_agent.settings import Settings

STEP_FIELDS = {"step", "kind", "name", "replay", "status", "input", "output"}


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exactly one line on stderr, and no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _finished_turn(
    store: JournalStore, leases: Leases, *, reply: str | None, error: str = ""
) -> str:
    """A turn with a two-step journal, ended as done (with reply) or failed (with error)."""
    turn = store.create_turn("cli-session", "email the launch note")
    claim = leases.claim(turn.turn_id, "w", 30.0)
    assert isinstance(claim, Claim)
    model_output = {
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup_note", "arguments": '{"name":"launch"}'},
                }
            ],
        }
    }
    store.insert_done(
        turn.turn_id, claim.epoch, 0, "model", "llm", {"messages": 2}, "safe", model_output
    )
    store.insert_intent(
        turn.turn_id,
        claim.epoch,
        1,
        "tool",
        "lookup_note",
        {"arguments": {"name": "launch"}},
        "safe",
    )
    store.record_outcome(turn.turn_id, claim.epoch, 1, {"content": "Friday at 10"})
    if reply is not None:
        assert leases.finish(turn.turn_id, claim.epoch, reply) is not None
    else:
        assert leases.fail(turn.turn_id, claim.epoch, error) is not None
    return turn.turn_id


def test_journal_of_unknown_turn_is_one_error_line(settings: Settings) -> None:
    """An unknown turn id prints one error line naming it and exits non-zero."""
    result = run_cli(settings, "journal", "turn_nope")

    line = _one_error_line(result)
    assert "turn_nope" in line
    assert result.stdout == ""


def test_journal_and_turns_json(settings: Settings, store: JournalStore, leases: Leases) -> None:
    """`journal --json` and `turns --json` print valid JSON with the recorded fields."""
    turn_id = _finished_turn(store, leases, reply="sent it")

    journal = run_cli(settings, "journal", turn_id, "--json")
    turns = run_cli(settings, "turns", "--json")

    assert journal.returncode == 0, journal.stderr
    steps = json.loads(journal.stdout)
    assert len(steps) == 2
    assert all(set(step) >= STEP_FIELDS for step in steps)
    assert [(s["step"], s["kind"], s["name"], s["replay"], s["status"]) for s in steps] == [
        (0, "model", "llm", "safe", "done"),
        (1, "tool", "lookup_note", "safe", "done"),
    ]
    assert steps[1]["input"] == {"arguments": {"name": "launch"}}
    assert steps[1]["output"] == {"content": "Friday at 10"}
    assert steps[0]["output"]["message"]["tool_calls"][0]["id"] == "call_1"

    assert turns.returncode == 0, turns.stderr
    listed = json.loads(turns.stdout)
    assert [(t["turn_id"], t["status"], t["reply"]) for t in listed] == [
        (turn_id, "done", "sent it")
    ]

    table = run_cli(settings, "journal", turn_id)
    assert table.returncode == 0, table.stderr
    assert "lookup_note" in table.stdout and "Friday at 10" in table.stdout


def test_submit_prints_a_recorded_turn_id(
    settings: Settings, store: JournalStore, redis_client: redis.Redis
) -> None:
    """`submit --session s "hi"` records a turn, enqueues it and prints its id."""
    result = run_cli(settings, "submit", "--session", "s", "hi")

    assert result.returncode == 0, result.stderr
    turn_id = result.stdout.strip()
    turn = store.get_turn(turn_id)
    assert (turn.session_id, turn.message, turn.status) == ("s", "hi", "queued")
    assert redis_client.llen(settings.queue) == 1


def test_wait_on_done_turn_prints_reply(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    """`wait` on a done turn prints its reply verbatim (long, with brackets) and exits 0."""
    reply = "Sent, see [the notes](http://notes/launch) [/b]. " + " ".join(
        f"word{i}" for i in range(60)
    )
    turn_id = _finished_turn(store, leases, reply=reply)

    result = run_cli(settings, "wait", turn_id)

    assert result.returncode == 0, result.stderr
    assert result.stdout == reply + "\n"


def test_wait_on_failed_turn_exits_1(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    """`wait` on a failed turn exits 1 and prints the reason on one line."""
    turn_id = _finished_turn(store, leases, reply=None, error="the model API rejected it")

    result = run_cli(settings, "wait", turn_id)

    assert result.returncode == 1
    line = _one_error_line(result)
    assert "the model API rejected it" in line
    assert result.stdout == ""


def test_wait_with_timeout_on_queued_turn_fails(settings: Settings, store: JournalStore) -> None:
    """`wait --timeout 0.5` on a turn nobody runs exits non-zero, saying it is still queued."""
    turn = store.create_turn("s", "hi")

    result = run_cli(settings, "wait", turn.turn_id, "--timeout", "0.5")

    line = _one_error_line(result)
    assert "still queued" in line


def test_sweep_prints_a_count(
    settings: Settings, pg: psycopg.Connection, store: JournalStore, redis_client: redis.Redis
) -> None:
    """`sweep` enqueues a long-unsent turn and prints what it did and how many."""
    turn = store.create_turn("s", "hi")
    pg.execute(
        "UPDATE turns SET created_at = now() - interval '1 hour' WHERE turn_id = %(t)s",
        {"t": turn.turn_id},
    )

    first = run_cli(settings, "sweep")
    second = run_cli(settings, "sweep")

    assert first.returncode == 0, first.stderr
    assert f"enqueued {turn.turn_id} (never enqueued)" in first.stdout
    assert "1 turn(s) enqueued" in first.stdout
    assert second.returncode == 0, second.stderr
    assert "0 turn(s) enqueued" in second.stdout
    assert redis_client.llen(settings.queue) == 1


def test_worker_with_unknown_tools_module_fails_with_one_line(settings: Settings) -> None:
    """A worker whose DURABLE_AGENT_TOOLS cannot be imported stops at once, naming it."""
    result = run_cli(settings, "worker", DURABLE_AGENT_TOOLS="no_such_module")

    line = _one_error_line(result)
    assert "no_such_module" in line


def test_migrate_against_unreachable_database_is_one_error_line(settings: Settings) -> None:
    """`migrate` with no Postgres at the URL prints one line saying it cannot reach it."""
    port = _closed_port()
    url = f"postgresql+psycopg://root@127.0.0.1:{port}/nowhere"

    result = run_cli(settings, "migrate", DURABLE_AGENT_DATABASE_URL=url)

    line = _one_error_line(result)
    assert "cannot reach Postgres" in line
    assert f"127.0.0.1:{port}/nowhere" in line


def test_tables_print_recorded_text_literally(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    """Replies and tool outputs that look like rich markup are shown as they are."""
    turn = store.create_turn("markup", "hi")
    claim = leases.claim(turn.turn_id, "w", 30.0)
    assert isinstance(claim, Claim)
    store.insert_done(
        turn.turn_id, claim.epoch, 0, "tool", "t", {}, "safe", {"content": "a [/b] c [bold]d"}
    )
    assert leases.finish(turn.turn_id, claim.epoch, "done [/x]")

    journal = run_cli(settings, "journal", turn.turn_id)
    turns = run_cli(settings, "turns", "--session", "markup")

    assert journal.returncode == 0, journal.stderr
    assert "a [/b] c [bold]d" in journal.stdout
    assert turns.returncode == 0, turns.stderr
    assert "done [/x]" in turns.stdout


def test_agents_at_the_command_line(settings: Settings, store: JournalStore) -> None:
    """`submit --agent` records the agent (an unknown one is one error line, exit 2);
    `worker --agent` refuses an agent no module defines; `journal` names the turn's agent."""
    unknown = run_cli(settings, "submit", "--session", "s", "--agent", "billing", "hi")
    assert unknown.returncode == 2
    assert "no agent named 'billing'" in _one_error_line(unknown)

    worker = run_cli(
        settings,
        "worker",
        "--agent",
        "billing",
        DURABLE_AGENT_TOOLS="durable_agent_examples.email_tools",
    )
    assert worker.returncode == 2
    assert "no agent named 'billing'" in _one_error_line(worker)

    env = {
        "DURABLE_AGENT_TOOLS": "durable_agent_examples.email_tools",
        "DURABLE_AGENT_AGENTS": "durable_agent_examples.plan_act",
    }
    planned = run_cli(settings, "submit", "--session", "p", "--agent", "planner", "hi", **env)
    assert planned.returncode == 0, planned.stderr
    turn = store.get_turn(planned.stdout.strip())
    assert (turn.agent, turn.queue) == ("planner", settings.queue)

    journal = run_cli(settings, "journal", turn.turn_id)
    assert journal.returncode == 0, journal.stderr
    assert "agent planner (not run yet)" in journal.stdout


def test_watch_prints_the_steps_after_a_step_then_the_end(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    """`watch` of a finished turn prints its steps and its end; `--after-step 0` starts after
    step 0; `--json` prints one object per line; a failed turn exits 1."""
    done_id = _finished_turn(store, leases, reply="sent it")
    failed_id = _finished_turn(store, leases, reply=None, error="no luck")

    full = run_cli(settings, "watch", done_id)
    rest = run_cli(settings, "watch", done_id, "--after-step", "0", "--json")
    failed = run_cli(settings, "watch", failed_id, "--after-step", "1")

    assert full.returncode == 0, full.stderr
    assert full.stdout.splitlines() == [
        'step 0  model llm: calls lookup_note({"name":"launch"})',
        "step 1  tool lookup_note (safe): Friday at 10",
        "done: sent it",
    ]
    assert rest.returncode == 0, rest.stderr
    events = [json.loads(line) for line in rest.stdout.splitlines()]
    assert [(e["event"], e.get("step"), e.get("status")) for e in events] == [
        ("step", 1, "done"),
        ("end", None, "done"),
    ]
    assert failed.returncode == 1 and failed.stdout == "failed: no luck\n", failed


def test_watch_refuses_bad_input_with_one_line(settings: Settings, store: JournalStore) -> None:
    """An unknown turn exits 4, a bad step 2, a turn still running past --timeout 3."""
    turn = store.create_turn("s", "hi")
    unknown = run_cli(settings, "watch", "turn_nope")
    bad_step = run_cli(settings, "watch", turn.turn_id, "--after-step", "-5")
    slow = run_cli(settings, "watch", turn.turn_id, "--timeout", "0.3")

    assert unknown.returncode == 4 and "turn_nope" in _one_error_line(unknown)
    assert bad_step.returncode == 2 and "after_step" in _one_error_line(bad_step)
    assert slow.returncode == 3 and "still queued" in _one_error_line(slow)
