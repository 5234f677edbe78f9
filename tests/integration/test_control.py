"""Operating turns on a real Postgres, Redis, scripted model and SMTP inbox, with the worker
in-process: cancel, approvals, the uncertain-effects inbox and its hooks, prune.

The command line is run as a real process for what an operator types.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from inprocess import CrashAt, SimulatedCrash, run_cli

from durable_agent import (
    approve,
    cancel_turn,
    deny,
    list_approvals,
    list_uncertain,
    resolve_uncertain,
)
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.errors import InvalidArgument, TurnNotFound
from durable_agent.journal import JournalStore, Refusal
from durable_agent.operate.cancel import CancelResult
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.faults import CrashPoint
from durable_agent.step.tools import ToolRegistry, load_tools
from durable_agent.testing import ScriptedModelServer, SmtpInbox
from durable_agent.testing.harness import forget_queue

if TYPE_CHECKING:
    from conftest import DatabaseClock

MESSAGE = "Please email the note launch to ada@example.com"
REPLY = "Done: the note 'launch' was sent to ada@example.com."


@pytest.fixture
def op_settings(settings: Settings, model_server: ScriptedModelServer) -> Settings:
    return settings.model_copy(update={"openai_base_url": model_server.base_url})


@pytest.fixture
def make_worker(op_settings: Settings, inbox: SmtpInbox) -> Iterator[Callable[..., TurnWorker]]:
    runtimes: list[Runtime] = []

    def make(
        crash: tuple[int | str, CrashPoint] | None = None,
        tools: ToolRegistry | None = None,
        **overrides: Any,
    ) -> TurnWorker:
        registry = tools or load_tools(["durable_agent_examples.email_tools"])
        runtime = Runtime(op_settings.model_copy(update=overrides), tools=registry)
        runtimes.append(runtime)
        return runtime.build_turn_worker(faults=CrashAt(crash))  # type: ignore[arg-type]

    yield make
    for runtime in runtimes:
        runtime.close()


def _crash_in_thread(worker: TurnWorker, turn_id: str) -> None:
    caught: list[BaseException] = []

    def run() -> None:
        try:
            worker.handle(turn_id)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash), caught


def _handle_when_free(worker: TurnWorker, turn_id: str, clock: DatabaseClock) -> Any:
    for _ in range(10):
        delivery = worker.handle(turn_id)
        if delivery.outcome != "refused":
            return delivery
        clock.advance(10.0)
    raise AssertionError(f"turn {turn_id} still refused: {delivery.detail}")


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_inside_a_never_call_lets_it_finish_then_stops_and_the_session_goes_on(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
) -> None:
    """The cancel arrives while send_email (never) runs: the email goes out once, its outcome
    is recorded, and the turn ends cancelled at the next step (no further model call); the
    next turn of the session is handed on and runs."""
    first = store.create_turn("s-cancel", MESSAGE)
    second = store.create_turn("s-cancel", "Now email the note standup to bob@example.com")
    email_tools = load_tools(["durable_agent_examples.email_tools"])
    send = email_tools.get("send_email")
    assert send is not None
    answers: list[Any] = []

    def send_then_cancelled(**kwargs: Any) -> Any:
        answers.append(cancel_turn(first.turn_id, "wrong note", by="ops", settings=op_settings))
        return send.function(**kwargs)

    tools = ToolRegistry(
        [t for t in email_tools if t.name != "send_email"]
        + [dataclasses.replace(send, function=send_then_cancelled)]
    )

    delivery = make_worker(tools=tools).handle(first.turn_id)

    assert delivery.outcome == "cancelled", delivery
    assert answers[0].requested and not answers[0].cancelled  # held: stops at the boundary
    turn = store.get_turn(first.turn_id)
    assert (turn.status, turn.error, turn.lease_owner) == (
        "cancelled",
        "cancelled by ops: wrong note",
        None,
    )
    steps = store.load_journal(first.turn_id)
    assert [(s.name, s.status) for s in steps] == [
        ("llm", "done"),
        ("lookup_note", "done"),
        ("llm", "done"),
        ("send_email", "done"),
    ]
    assert inbox.count == 1 and model_server.request_count == 2
    assert delivery.follow_up is not None and delivery.follow_up[1] == second.turn_id

    assert make_worker().handle(second.turn_id).outcome == "done"
    history = model_server.requests[-1]["messages"]
    assert MESSAGE not in [m.get("content") for m in history]  # a cancelled turn is no history


def test_cancel_during_the_last_model_call_ends_the_turn_cancelled(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
) -> None:
    """The cancel arrives while the model call that gives the reply runs: the cancel says the
    turn stops at its next step boundary, and it does: the end of the turn is one. The turn
    ends cancelled, never done; the reply the model gave is kept in the journal."""
    turn = store.create_turn("s-late-cancel", MESSAGE)
    policy = model_server.policy
    answers: list[Any] = []

    def cancel_during_the_reply(body: dict[str, Any]) -> dict[str, Any]:
        answer = policy(body)
        if not answer.get("tool_calls"):  # the last call: it gives the reply
            answers.append(cancel_turn(turn.turn_id, "too slow", by="ops", settings=op_settings))
        return answer

    model_server.policy = cancel_during_the_reply

    delivery = make_worker().handle(turn.turn_id)

    said = answers[0]
    assert said.requested and not said.turn.finished, said
    assert "stops at its next step boundary" in said.describe()
    ended = store.get_turn(turn.turn_id)
    assert delivery.outcome == "cancelled", delivery
    assert (ended.status, ended.error, ended.reply) == (
        "cancelled",
        "cancelled by ops: too slow",
        None,
    )
    last = store.load_journal(turn.turn_id)[-1]
    assert (last.kind, last.status) == ("model", "done")
    assert REPLY in json.dumps(last.output)  # the reply stays in the journal, for the record
    assert inbox.count == 1


def test_cancel_racing_the_end_of_a_turn_never_says_it_stops_when_the_turn_ends_done(
    op_settings: Settings, store: JournalStore, runtime: Runtime
) -> None:
    """A cancel and the end of the turn at the same moment, many times: either the cancel is
    recorded and the turn ends cancelled, or the cancel finds the turn ended and says it
    came too late. Never "it stops at its next step boundary" and then done."""
    outcomes: dict[str, int] = {}
    for n in range(60):
        turn = store.create_turn(f"s-race-{n}", MESSAGE)
        claim = runtime.leases.claim(turn.turn_id, "w", 30.0)
        assert not isinstance(claim, Refusal)
        result = _cancel_racing_the_end(runtime, op_settings, turn.turn_id, claim.epoch)
        final = store.get_turn(turn.turn_id).status
        stops = result.cancellation is not None and not result.turn.finished
        assert not (stops and final == "done"), (n, result.describe(), final)
        assert final in ("done", "cancelled")
        if final == "done":
            assert "too late" in result.describe(), result.describe()
        outcomes[final] = outcomes.get(final, 0) + 1
    assert sum(outcomes.values()) == 60, outcomes


def _cancel_racing_the_end(
    runtime: Runtime, op_settings: Settings, turn_id: str, epoch: int
) -> CancelResult:
    """The holder ends the turn (done) while an operator cancels it, both let go at once;
    what the cancel said."""
    start = threading.Barrier(2)
    said: list[CancelResult] = []

    def end() -> None:
        start.wait()
        runtime.leases.finish(turn_id, epoch, "the reply")

    def ask() -> None:
        start.wait()  # the operator's runtime (other settings): its own connection
        said.append(cancel_turn(turn_id, settings=op_settings))

    threads = [threading.Thread(target=end), threading.Thread(target=ask)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return said[0]


def test_cancel_of_a_turn_no_worker_holds_ends_it_at_once(
    op_settings: Settings, store: JournalStore, runtime: Runtime, clock: DatabaseClock
) -> None:
    """A queued turn is cancelled at once (CLI), with who and why; `wait` reports it as an
    end (exit 1); cancelling again or an unknown id or a bad reason are one-line errors."""
    turn = store.create_turn("s-queued", MESSAGE)
    later = store.create_turn("s-queued", "and then this")

    result = run_cli(op_settings, "cancel", turn.turn_id, "--reason", "duplicate", "--by", "ada")

    assert result.returncode == 0, result.stderr
    assert f"turn {turn.turn_id} cancelled (cancelled by ada: duplicate)" in result.stdout
    ended = store.get_turn(turn.turn_id)
    assert ended.status == "cancelled" and ended.finished_at is not None
    assert ended.attempts == 0 and store.load_journal(turn.turn_id) == []
    # the session goes on: the later turn was sent; the cancelled one is never sent again
    assert store.get_turn(later.turn_id).message_id is not None
    clock.advance(3600)
    assert turn.turn_id not in [t for _, t, _ in runtime.sweeper().sweep_once()]

    waited = run_cli(op_settings, "wait", turn.turn_id, "--timeout", "5")
    assert waited.returncode == 1
    assert waited.stderr.strip() == f"error: turn {turn.turn_id} was cancelled by ada: duplicate"

    again = cancel_turn(turn.turn_id, settings=op_settings)
    assert not again.requested and again.turn.status == "cancelled"
    done = run_cli(op_settings, "cancel", turn.turn_id, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["requested_by"] == "ada"
    # cancelling a cancelled turn succeeds (what was asked holds) and says who did it first
    twice = run_cli(op_settings, "cancel", turn.turn_id, "--by", "bob")
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout.strip() == (
        f"turn {turn.turn_id} was already cancelled by ada: duplicate; nothing changed"
    )
    with pytest.raises(TurnNotFound):
        cancel_turn("turn_nope", settings=op_settings)
    with pytest.raises(InvalidArgument):
        cancel_turn(later.turn_id, "x" * 5000, settings=op_settings)
    missing = run_cli(op_settings, "cancel", "turn_nope")
    assert missing.returncode == 4 and missing.stderr.startswith("error: ")
    assert "Traceback" not in missing.stderr


# -- approvals ---------------------------------------------------------------------------------


def test_denied_call_never_runs_and_the_model_reads_the_reason(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    runtime: Runtime,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """send_email needs approval: the turn parks (waiting, no claim), the sweeper never sends
    it, wait_for_turn does not see an end; a denial queues it, the next delivery records
    the call as not run, and the model reads the reason."""
    worker = make_worker(approval_required="send_email")
    turn = store.create_turn("s-deny", MESSAGE)
    runtime.enqueue(turn.session_id, turn.turn_id, turn.queue)

    parked = worker.handle(turn.turn_id)

    assert parked.outcome == "parked", parked
    waiting = store.get_turn(turn.turn_id)
    assert (waiting.status, waiting.lease_owner, waiting.lease_expires_at) == (
        "waiting",
        None,
        None,
    )
    [pending] = list_approvals(settings=op_settings)
    assert (pending.step, pending.tool, pending.decision) == (3, "send_email", None)
    assert pending.arguments["to"] == "ada@example.com" and pending.idempotency_key
    # the model step that asked for the call is written before the turn parks
    assert [(s.step, s.status) for s in store.load_journal(turn.turn_id)] == [
        (0, "done"),
        (1, "done"),
        (2, "done"),
    ]
    clock.advance(3600)
    assert runtime.sweeper().sweep_once() == []  # never re-sent while it waits
    with pytest.raises(TimeoutError, match="parked: it waits"):
        runtime.wait_for_turn(turn.turn_id, 0.2)
    assert worker.handle(turn.turn_id).outcome == "refused"  # a stray copy runs nothing

    decided = deny(turn.turn_id, 3, "not to external addresses", by="ada", settings=op_settings)

    assert (decided.decision, decided.decided_by) == ("denied", "ada")
    assert store.get_turn(turn.turn_id).status == "queued"
    with pytest.raises(InvalidArgument, match="already denied by ada"):
        approve(turn.turn_id, 3, settings=op_settings)
    done = worker.handle(turn.turn_id)
    assert done.outcome == "done", done
    assert inbox.count == 0
    step = store.load_journal(turn.turn_id)[3]
    assert (step.name, step.status, step.output["denied"]) == ("send_email", "done", True)
    assert "denied by ada: not to external addresses" in step.output["content"]
    assert "denied by ada" in model_server.requests[-1]["messages"][-1]["content"]
    assert model_server.repeated_requests() == 0


def test_approved_call_interrupted_after_it_ran_is_never_run_again(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    runtime: Runtime,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """Approved, then the worker dies right after send_email ran: the next delivery records
    'may or may not have happened' without asking again or sending; one email; the decision
    is in the call's intent."""
    turn = store.create_turn("s-approve", MESSAGE)
    assert make_worker(approval_required="send_email").handle(turn.turn_id).outcome == "parked"
    assert approve(turn.turn_id, 3, by="ada", settings=op_settings).decision == "approved"
    # another turn parks, then is cancelled: its pending call waits for nothing
    other = store.create_turn("s-other", "Email the note standup to bob@example.com")
    assert make_worker(approval_required="send_email").handle(other.turn_id).outcome == "parked"
    assert cancel_turn(other.turn_id, settings=op_settings).cancelled
    assert list_approvals(settings=op_settings) == []

    doomed = make_worker(crash=(3, "after_run"), approval_required="send_email", lease_seconds=0.5)
    _crash_in_thread(doomed, turn.turn_id)
    assert inbox.count == 1
    delivery = _handle_when_free(make_worker(approval_required="send_email"), turn.turn_id, clock)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert inbox.count == 1
    steps = store.load_journal(turn.turn_id)
    assert steps[3].input["approval"]["decided_by"] == "ada"
    assert steps[3].output["uncertain"] is True
    assert [s.name for s in steps[4:]] == ["llm", "list_sent_emails", "llm"]
    assert model_server.repeated_requests() == 0
    listed = list_approvals(include_decided=True, settings=op_settings)
    assert [(a.turn_id, a.decision, a.turn_status) for a in listed] == [
        (turn.turn_id, "approved", "done"),
        (other.turn_id, None, "cancelled"),
    ]


def test_approved_call_interrupted_before_it_ran_asks_again_for_the_retry(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    inbox: SmtpInbox,
    clock: DatabaseClock,
) -> None:
    """Approved, then the worker dies after the call's intent and before it ran: the call
    is not run on resume ('may or may not have happened'); the model checks, finds nothing
    and calls send_email again: a new call, so it waits for its own approval, and then runs
    with the interrupted call's idempotency key. One email."""
    turn = store.create_turn("s-before", MESSAGE)
    assert make_worker(approval_required="send_email").handle(turn.turn_id).outcome == "parked"
    approve(turn.turn_id, 3, by="ada", settings=op_settings)
    doomed = make_worker(crash=(3, "before_run"), approval_required="send_email", lease_seconds=0.5)
    _crash_in_thread(doomed, turn.turn_id)
    assert inbox.count == 0

    again = _handle_when_free(make_worker(approval_required="send_email"), turn.turn_id, clock)

    assert again.outcome == "parked", again
    assert [
        (a.step, a.decision) for a in list_approvals(include_decided=True, settings=op_settings)
    ] == [
        (3, "approved"),
        (7, None),
    ]
    approve(turn.turn_id, 7, by="ada", settings=op_settings)
    done = make_worker(approval_required="send_email").handle(turn.turn_id)
    assert (done.outcome, done.detail) == ("done", REPLY)
    steps = store.load_journal(turn.turn_id)
    assert inbox.count == 1
    assert steps[7].input["idempotency_key"] == steps[3].input["idempotency_key"]
    [effect] = list_uncertain(settings=op_settings)
    assert effect.next == (
        "checked with list_sent_emails (step 5), then retried with the same key (step 7)"
    )
    assert effect.agent == "default" and effect.as_json()["agent"] == "default"
    assert list_uncertain(agent="default", settings=op_settings) == [effect]
    assert list_uncertain(agent="billing", settings=op_settings) == []  # another agent's only


# -- the uncertain-effects inbox ---------------------------------------------------------------


def test_uncertain_inbox_lists_resolves_and_tells_the_hooks_once(
    make_worker: Callable[..., TurnWorker],
    op_settings: Settings,
    store: JournalStore,
    redis_client: redis.Redis,
    clock: DatabaseClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupted send_email is listed with what the model did next; the sweeper gives
    it to the callback and the Celery task once; resolving it (CLI) records who and when
    and leaves the journal as it was."""
    turn = store.create_turn("s-uncertain", MESSAGE)
    _crash_in_thread(make_worker(crash=(3, "after_run"), lease_seconds=0.5), turn.turn_id)
    assert list_uncertain(settings=op_settings) == []  # not yet: the turn is still open
    _handle_when_free(make_worker(), turn.turn_id, clock)

    [effect] = list_uncertain(settings=op_settings)
    assert (effect.turn_id, effect.step, effect.tool, effect.how) == (
        turn.turn_id,
        3,
        "send_email",
        "interrupted",
    )
    assert effect.arguments["to"] == "ada@example.com"
    assert effect.idempotency_key == store.load_journal(turn.turn_id)[3].input["idempotency_key"]
    assert (
        effect.next
        == "checked with list_sent_emails (step 5), then did not retry; the turn ended done"
    )

    pager = tmp_path / "pager.jsonl"
    monkeypatch.setenv("PAGER_FILE", str(pager))
    hooked = op_settings.model_copy(
        update={
            "uncertain_callback": "durable_agent_examples.pager:page",
            "uncertain_task": "myapp.page_oncall",
            "uncertain_queue": f"{op_settings.queue}-pager",
        }
    )
    sweeping = Runtime(hooked)
    try:
        sweeping.sweeper().sweep_once()
        sweeping.sweeper().sweep_once()  # told once: nothing new the second time
    finally:
        sweeping.close()
    try:
        told = [json.loads(line) for line in pager.read_text().splitlines()]
        sent = [json.loads(raw) for raw in redis_client.lrange(f"{op_settings.queue}-pager", 0, -1)]
    finally:
        forget_queue(redis_client, f"{op_settings.queue}-pager")
    assert [(t["turn_id"], t["step"]) for t in told] == [(turn.turn_id, 3)]
    assert [m["headers"]["task"] for m in sent] == ["myapp.page_oncall"]
    [args] = json.loads(base64.b64decode(sent[0]["body"]))[0]
    assert (args["turn_id"], args["step"], args["how"]) == (turn.turn_id, 3, "interrupted")

    journal = store.load_journal(turn.turn_id)
    result = run_cli(
        op_settings,
        "resolve",
        turn.turn_id,
        "3",
        "--happened",
        "--note",
        "in the outbox",
        "--by",
        "ada",
    )
    assert result.returncode == 0, result.stderr
    assert "send_email): happened, by ada at" in result.stdout
    assert store.load_journal(turn.turn_id) == journal
    assert list_uncertain(settings=op_settings) == []
    listed = json.loads(run_cli(op_settings, "uncertain", "--all", "--json").stdout)
    assert [(e["step"], e["resolution"]["verdict"], e["resolution"]["note"]) for e in listed] == [
        (3, "happened", "in the outbox")
    ]
    with pytest.raises(InvalidArgument, match="not an uncertain effect"):
        resolve_uncertain(turn.turn_id, 1, "happened", settings=op_settings)
    bad = run_cli(op_settings, "resolve", turn.turn_id, "x", "--ignore")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

    # a second verdict does not replace the first silently: refused, naming the first ...
    again = run_cli(op_settings, "resolve", turn.turn_id, "3", "--not-happened", "--by", "bob")
    assert again.returncode == 2, again.stdout
    assert again.stderr.startswith(f"error: step 3 of turn {turn.turn_id} was already resolved")
    assert "happened by ada at" in again.stderr and "--replace" in again.stderr
    assert len(again.stderr.splitlines()) == 1
    [kept] = list_uncertain(turn_id=turn.turn_id, include_resolved=True, settings=op_settings)
    assert kept.resolution is not None and kept.resolution.resolved_by == "ada"
    # ... and with --replace it is recorded, saying what it replaces
    replaced = run_cli(
        op_settings, "resolve", turn.turn_id, "3", "--not-happened", "--by", "bob", "--replace"
    )
    assert replaced.returncode == 0, replaced.stderr
    assert "send_email): not_happened, by bob at" in replaced.stdout
    assert "; replaces happened by ada at" in replaced.stdout
    [now] = list_uncertain(turn_id=turn.turn_id, include_resolved=True, settings=op_settings)
    assert now.resolution is not None and now.resolution.verdict == "not_happened"


@pytest.mark.parametrize("command", ["uncertain", "approvals"])
def test_listing_an_unknown_turn_is_an_error_not_an_empty_table(
    op_settings: Settings, command: str
) -> None:
    """`uncertain --turn` and `approvals --turn` with a turn id nobody recorded: one error
    line and exit 4 (TurnNotFound), as `journal` and `wait` do; the Python API raises."""
    result = run_cli(op_settings, command, "--turn", "turn_nosuch")
    assert result.returncode == 4, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    assert "turn_nosuch" in result.stderr
    listing = list_uncertain if command == "uncertain" else list_approvals
    with pytest.raises(TurnNotFound):
        listing(turn_id="turn_nosuch", settings=op_settings)


# -- prune -------------------------------------------------------------------------------------


def _ended_turn(
    store: JournalStore, leases: Any, session: str, *, output: Any, never: bool = False
) -> str:
    """A done turn with a model step and one tool step whose outcome is ``output``."""
    turn = store.create_turn(session, MESSAGE)
    claim = leases.claim(turn.turn_id, "w", 30.0)
    store.insert_done(turn.turn_id, claim.epoch, 0, "model", "llm", {}, "safe", {"message": {}})
    replay = "never" if never else "safe"
    store.insert_intent(turn.turn_id, claim.epoch, 1, "tool", "t", {"arguments": {}}, replay)
    store.record_outcome(turn.turn_id, claim.epoch, 1, output)
    assert leases.finish(turn.turn_id, claim.epoch, "ok") is not None
    return turn.turn_id


def test_prune_deletes_old_finished_turns_and_keeps_what_is_still_needed(
    op_settings: Settings,
    store: JournalStore,
    leases: Any,
    runtime: Runtime,
    clock: DatabaseClock,
    pg: Any,
) -> None:
    """Old finished turns go with their journal and their blob; a turn with an unresolved
    uncertain effect stays until it is resolved, and so does a turn whose session still has
    an open turn; a turn that ended recently stays."""
    big = {"content": "x" * 5000}  # over the store's blob threshold
    old = _ended_turn(store, leases, "s-old", output=big)
    unsure = _ended_turn(
        store, leases, "s-unsure", output={"content": "?", "uncertain": True}, never=True
    )
    open_session = _ended_turn(store, leases, "s-open", output={"content": "ok"})
    store.create_turn("s-open", "still to run")
    assert pg.execute("SELECT count(*) FROM blobs").fetchone()[0] == 1
    clock.advance(31 * 86_400)
    recent = _ended_turn(store, leases, "s-recent", output={"content": "ok"})

    preview = run_cli(op_settings, "prune", "--older-than", "30d", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.strip() == (
        "would delete 1 finished turn(s) older than 30d (2 journal row(s)); "
        "kept 1 with unresolved uncertain effects and 1 of sessions with an open turn "
        "or children of an open turn"
    )
    assert store.find_turn(old) is not None

    pruned = run_cli(op_settings, "prune", "--older-than", "30d", "--json", "--batch", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout) == {
        "dry_run": False,
        "turns": 1,
        "steps": 2,
        "kept": 1,
        "kept_open_session": 1,
        "blobs": 1,
    }
    assert store.find_turn(old) is None and store.load_journal(old) == []
    assert pg.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
    assert all(store.find_turn(t) is not None for t in (unsure, open_session, recent))

    resolve_uncertain(unsure, 1, "not_happened", by="ada", settings=op_settings)
    from durable_agent import prune

    assert prune("30d", settings=op_settings).turns == 1
    assert store.find_turn(unsure) is None
    assert store.find_turn(open_session) is not None and store.find_turn(recent) is not None
    bad = run_cli(op_settings, "prune", "--older-than", "soon")
    assert bad.returncode == 2 and bad.stderr.startswith("error: not an age: 'soon'")


def test_worker_with_a_callback_it_cannot_import_stops_with_one_line(op_settings: Settings) -> None:
    """A DURABLE_AGENT_UNCERTAIN_CALLBACK that names nothing importable stops the worker at
    start with one line naming it, instead of a warning at every sweep."""
    result = run_cli(
        op_settings,
        "worker",
        DURABLE_AGENT_TOOLS="durable_agent_examples.email_tools",
        DURABLE_AGENT_UNCERTAIN_CALLBACK="no_such_pager:page",
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "no_such_pager:page" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
